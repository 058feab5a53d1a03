"""The simulated GPUs' own state: power draw, throttling, ECC, row remapping, XIDs, loss.

:class:`SimDevices` is the device half of a simulated node (``agent.sim.world``
holds the other half: limits, processes, pods, call faults). It answers the
backend's :meth:`~capwatch.agent.gpus.GpuBackend.readings` and queues device events the
way NVML's event set would, and tests and scenarios change it with a few
methods (:meth:`queue_xid`, :meth:`ecc_error`, :meth:`lose`, ...); a scenario's
``device_faults`` call the same methods as their cycles begin (``agent.sim.faults``).

Power follows a simple, deterministic model that shows what capping does: an
idle GPU draws a tenth of its default limit; a busy one wants 90 % of its
maximum and draws the smaller of that and its limit, with ``sw_power_cap``
among its throttle reasons while the limit holds it back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from capwatch.agent.health.telemetry import (
    DeviceEventKind,
    EventAccumulator,
    Readings,
    ThrottleReason,
)

# The reads a GPU can answer, by the names Readings.failed_reads uses.
READS = ("power_draw", "enforced_limit", "throttle_reasons", "ecc", "row_remap")


@dataclass(frozen=True, kw_only=True)
class SimDeviceState:
    lost: bool = False
    ecc_uncorrected: int = 0
    row_remap_pending: bool = False
    row_remap_failure: bool = False
    extra_throttle: frozenset[ThrottleReason] = frozenset()
    unsupported: frozenset[str] = frozenset()  # reads answering "not supported"
    failing: frozenset[str] = frozenset()  # reads failing with another error
    retired_pages: bool = False  # an older part: page retirement, no row remapping


@dataclass
class SimDevices:
    """Every simulated GPU's device state. Thread-safe."""

    count: int
    events: EventAccumulator = field(default_factory=EventAccumulator)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._state = [SimDeviceState() for _ in range(self.count)]

    def state(self, index: int) -> SimDeviceState:
        with self._lock:
            return self._state[index]

    def is_lost(self, index: int) -> bool:
        with self._lock:
            return 0 <= index < self.count and self._state[index].lost

    # --- changes (tests, scenarios) -----------------------------------------------------

    def queue_xid(self, index: int, code: int, *, uuid: str | None, count: int = 1) -> None:
        """``count`` XID events of number ``code`` on GPU ``index``, as NVML would deliver."""
        self.events.add(DeviceEventKind.XID, index=index, uuid=uuid, code=code, count=count)

    def ecc_error(self, index: int, *, uuid: str | None, count: int = 1) -> None:
        """``count`` uncorrectable ECC errors: the volatile count rises and events fire."""
        self._change(index, lambda s: replace(s, ecc_uncorrected=s.ecc_uncorrected + count))
        self.events.add(DeviceEventKind.ECC_DOUBLE_BIT, index=index, uuid=uuid, code=0, count=count)

    def lose(self, index: int) -> None:
        """Every call on GPU ``index`` answers "GPU is lost" until :meth:`recover`."""
        self._change(index, lambda s: replace(s, lost=True))

    def recover(self, index: int) -> None:
        """The GPU answers again (same UUID); a reset also zeroes its volatile ECC count."""
        self._change(index, lambda s: replace(s, lost=False, ecc_uncorrected=0))

    def set_row_remap(self, index: int, *, pending: bool, failure: bool) -> None:
        self._change(
            index, lambda s: replace(s, row_remap_pending=pending, row_remap_failure=failure)
        )

    def set_throttle(self, index: int, reasons: Iterable[ThrottleReason]) -> None:
        """Throttle reasons beyond the power model's own (thermal slowdown, say)."""
        extra = frozenset(reasons)
        self._change(index, lambda s: replace(s, extra_throttle=extra))

    def set_unsupported(self, index: int, reads: Iterable[str]) -> None:
        """Reads that answer "not supported" on GPU ``index`` (names from :data:`READS`)."""
        names = _checked(reads)
        self._change(index, lambda s: replace(s, unsupported=names))

    def set_failing(self, index: int, reads: Iterable[str]) -> None:
        """Reads that fail with an error other than "not supported"."""
        names = _checked(reads)
        self._change(index, lambda s: replace(s, failing=names))

    def set_older_part(self, index: int, older: bool) -> None:
        """An older part retires pages instead of remapping rows: its row-remap reads are
        not available, and a pending remap reads as pages pending retirement."""
        self._change(index, lambda s: replace(s, retired_pages=older))

    # --- reads ------------------------------------------------------------------------

    def readings(
        self, index: int, *, limit_mw: int, default_mw: int, max_mw: int, busy: bool
    ) -> Readings:
        """What GPU ``index`` answers to this cycle's reads."""
        state = self.state(index)
        if state.lost:
            return Readings(lost=True)
        wanted = max_mw * 9 // 10 if busy else default_mw // 10
        draw = min(wanted, limit_mw)
        reasons = set(state.extra_throttle)
        if not busy:
            reasons.add(ThrottleReason.GPU_IDLE)
        elif wanted > limit_mw:
            reasons.add(ThrottleReason.SW_POWER_CAP)

        def available(name: str) -> bool:
            return name not in state.unsupported and name not in state.failing

        remap = available("row_remap") and not state.retired_pages
        return Readings(
            power_draw_milliwatts=draw if available("power_draw") else None,
            enforced_limit_milliwatts=limit_mw if available("enforced_limit") else None,
            throttle_reasons=tuple(sorted(reasons, key=lambda r: r.value))
            if available("throttle_reasons")
            else None,
            ecc_uncorrected_volatile=state.ecc_uncorrected if available("ecc") else None,
            row_remap_pending=state.row_remap_pending if remap else None,
            row_remap_failure=state.row_remap_failure if remap else None,
            retired_pages_pending=state.row_remap_pending
            if state.retired_pages and available("row_remap")
            else None,
            failed_reads=tuple(r for r in READS if r in state.failing),
        )

    def _change(self, index: int, change: Callable[[SimDeviceState], SimDeviceState]) -> None:
        if not 0 <= index < self.count:
            raise IndexError(f"no simulated GPU at index {index}")
        with self._lock:
            self._state[index] = change(self._state[index])


def _checked(reads: Iterable[str]) -> frozenset[str]:
    names = frozenset(reads)
    unknown = sorted(names - set(READS))
    if unknown:
        raise ValueError(f"unknown reads {unknown}; known: {', '.join(READS)}")
    return names
