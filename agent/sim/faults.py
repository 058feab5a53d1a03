"""A scenario's device faults, applied to the simulated devices as each cycle begins.

:class:`DeviceFaultSchedule` turns the ``device_faults`` of a scenario (see
``agent.sim.scenario_devices``) into calls on :class:`~capwatch.agent.sim.devices.SimDevices`:

- ``xid`` and ``ecc`` fire their ``count`` events in every cycle their range
  covers, as that cycle begins, bound to the GPU's UUID (never at start-up:
  events need a cycle to drain them);
- the others hold a state during their range: the GPU is lost, its row
  remapping failed or is pending, it throttles for extra reasons, reads are not
  supported or fail, it is an older part. Faults of one kind on one GPU that
  overlap add up (throttle reasons and reads are their union).

State is changed only where what the scenario holds changes between two
cycles, so the runtime methods tests call (``world.devices.lose(0)``, ...)
stay in force until a scenario fault on that GPU and state starts or ends.
When a ``lost`` range ends the GPU answers again with the same UUID (a reset:
its volatile ECC count is zeroed).

Deterministic: the same scenario and the same cycles give the same calls, in
file order.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, fields

from capwatch.agent.health.telemetry import ThrottleReason
from capwatch.agent.sim.devices import SimDevices
from capwatch.agent.sim.scenario_devices import DeviceFaultKind, DeviceFaultSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class HeldState:
    """What a scenario's state-holding device faults say about one GPU in one cycle."""

    lost: bool = False
    row_remap_failure: bool = False
    row_remap_pending: bool = False
    throttle: frozenset[ThrottleReason] = frozenset()
    unsupported: frozenset[str] = frozenset()
    failing: frozenset[str] = frozenset()
    older_part: bool = False


NOTHING_HELD = HeldState()


def held_state(faults: Sequence[DeviceFaultSpec], gpu: int, cycle: int) -> HeldState:
    """The state ``faults`` hold on GPU ``gpu`` in ``cycle``."""
    active = [f for f in faults if f.gpu == gpu and f.cycles.contains(cycle)]

    def any_of(kind: DeviceFaultKind) -> bool:
        return any(f.kind is kind for f in active)

    return HeldState(
        lost=any_of(DeviceFaultKind.LOST),
        row_remap_failure=any_of(DeviceFaultKind.ROW_REMAP_FAILURE),
        row_remap_pending=any_of(DeviceFaultKind.ROW_REMAP_PENDING),
        throttle=frozenset(r for f in active for r in f.reasons),
        unsupported=frozenset(
            r for f in active if f.kind is DeviceFaultKind.UNSUPPORTED for r in f.reads
        ),
        failing=frozenset(r for f in active if f.kind is DeviceFaultKind.FAILING for r in f.reads),
        older_part=any_of(DeviceFaultKind.OLDER_PART),
    )


class DeviceFaultSchedule:
    """Applies a scenario's device faults to ``devices``, cycle by cycle. Thread-safe."""

    def __init__(
        self, faults: Sequence[DeviceFaultSpec], *, devices: SimDevices, uuids: Sequence[str]
    ) -> None:
        self._faults = tuple(faults)
        self._devices = devices
        self._uuids = tuple(uuids)
        self._lock = threading.Lock()
        self._held = [NOTHING_HELD] * len(self._uuids)

    def hold(self, cycle: int) -> None:
        """Make the devices hold what the faults say for ``cycle``, firing no events
        (start-up: cycle 0)."""
        with self._lock:
            self._hold(cycle)

    def begin_cycle(self, cycle: int) -> None:
        """``cycle`` begins: change the state the faults hold, then fire its events."""
        with self._lock:
            self._hold(cycle)
            for fault in self._faults:
                if not (fault.kind.fires_events and fault.cycles.contains(cycle)):
                    continue
                uuid = self._uuids[fault.gpu]
                if fault.kind is DeviceFaultKind.XID:
                    self._devices.queue_xid(fault.gpu, fault.code, uuid=uuid, count=fault.count)
                else:
                    self._devices.ecc_error(fault.gpu, uuid=uuid, count=fault.count)
                log.debug(
                    "sim device event kind=%s gpu=%d code=%d count=%d cycle=%d",
                    fault.kind.value,
                    fault.gpu,
                    fault.code,
                    fault.count,
                    cycle,
                )

    def _hold(self, cycle: int) -> None:
        for gpu, before in enumerate(self._held):
            now = held_state(self._faults, gpu, cycle)
            if now == before:
                continue
            self._apply(gpu, before, now)
            self._held[gpu] = now
            changed = [
                f.name for f in fields(HeldState) if getattr(now, f.name) != getattr(before, f.name)
            ]
            log.info("sim device state gpu=%d cycle=%d changed=%s", gpu, cycle, ",".join(changed))

    def _apply(self, gpu: int, before: HeldState, now: HeldState) -> None:
        devices = self._devices
        if now.lost != before.lost:
            if now.lost:
                devices.lose(gpu)
            else:
                devices.recover(gpu)
        remap = (now.row_remap_pending, now.row_remap_failure)
        if remap != (before.row_remap_pending, before.row_remap_failure):
            devices.set_row_remap(gpu, pending=now.row_remap_pending, failure=now.row_remap_failure)
        if now.throttle != before.throttle:
            devices.set_throttle(gpu, now.throttle)
        if now.unsupported != before.unsupported:
            devices.set_unsupported(gpu, now.unsupported)
        if now.failing != before.failing:
            devices.set_failing(gpu, now.failing)
        if now.older_part != before.older_part:
            devices.set_older_part(gpu, now.older_part)
