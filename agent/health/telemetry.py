"""What a GPU says about itself: per-cycle readings and asynchronous device events.

Both GPU backends produce these values; :mod:`capwatch.agent.health.faults` judges them.

- :class:`Readings` are read once per cycle, per GPU: power draw, the enforced
  power limit read back, the clock-event (throttle) reasons, the volatile
  uncorrected ECC count and the row-remapping (or, on parts without it, page
  retirement) state. A read the device does not support is ``None``: "not
  available", never a fault. A read that failed otherwise is ``None`` too and
  its name is in ``failed_reads``, so a GPU that errors on every read shows as
  such instead of as one that supports nothing. ``lost`` says a read returned
  NVML's "GPU is lost".
- :class:`DeviceEvent` aggregates XID and double-bit ECC events between two
  drains, per GPU, kind and code. An :class:`EventAccumulator` holds them
  between the producer (NVML's event thread, or the simulated node) and the
  cycle that drains them, with a bound on distinct keys: a flood of 10,000 XIDs
  is one entry with a count, never 10,000 objects.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum

log = logging.getLogger(__name__)

# Distinct (GPU, kind, code) keys kept between two drains; more are dropped and counted.
EVENT_KEYS_LIMIT = 1024


class ThrottleReason(str, Enum):
    """NVML's clock-event reasons, as stable tokens (``nvmlClocksEventReason*``)."""

    GPU_IDLE = "gpu_idle"
    APPLICATIONS_CLOCKS_SETTING = "applications_clocks_setting"
    SW_POWER_CAP = "sw_power_cap"
    HW_SLOWDOWN = "hw_slowdown"
    SYNC_BOOST = "sync_boost"
    SW_THERMAL_SLOWDOWN = "sw_thermal_slowdown"
    HW_THERMAL_SLOWDOWN = "hw_thermal_slowdown"
    HW_POWER_BRAKE_SLOWDOWN = "hw_power_brake_slowdown"
    DISPLAY_CLOCK_SETTING = "display_clock_setting"


@dataclass(frozen=True, kw_only=True)
class Readings:
    """One GPU's per-cycle reads. ``None``: not available (unsupported, or failed)."""

    power_draw_milliwatts: int | None = None
    enforced_limit_milliwatts: int | None = None
    throttle_reasons: tuple[ThrottleReason, ...] | None = None  # sorted by value
    ecc_uncorrected_volatile: int | None = None
    row_remap_pending: bool | None = None
    row_remap_failure: bool | None = None
    retired_pages_pending: bool | None = None
    # Reads that failed with an error other than "not supported", by name.
    failed_reads: tuple[str, ...] = ()
    lost: bool = False  # a read returned "GPU is lost"


NO_READINGS = Readings()


class DeviceEventKind(str, Enum):
    XID = "xid"  # a critical XID error event; ``code`` is the XID number
    ECC_DOUBLE_BIT = "ecc_double_bit"  # a double-bit (uncorrectable) ECC event; code 0


@dataclass(frozen=True, kw_only=True)
class DeviceEvent:
    """Every event of one kind and code on one GPU since the last drain."""

    kind: DeviceEventKind
    index: int
    uuid: str | None  # None when the event named a device whose UUID could not be read
    code: int
    count: int
    first_wall: float
    last_wall: float


class EventAccumulator:
    """Events between their producer's thread and the cycle's drain. Thread-safe, bounded."""

    def __init__(
        self, *, limit: int = EVENT_KEYS_LIMIT, wall: Callable[[], float] = time.time
    ) -> None:
        self._limit = limit
        self._wall = wall
        self._lock = threading.Lock()
        self._events: dict[tuple[int, str | None, DeviceEventKind, int], DeviceEvent] = {}
        self._dropped = 0
        self._dropped_total = 0

    def add(
        self,
        kind: DeviceEventKind,
        *,
        index: int,
        uuid: str | None,
        code: int,
        count: int = 1,
    ) -> None:
        """Record ``count`` events; O(1), never blocks on anything but this object's lock."""
        now = self._wall()
        key = (index, uuid, kind, code)
        with self._lock:
            old = self._events.get(key)
            if old is not None:
                self._events[key] = replace(old, count=old.count + count, last_wall=now)
            elif len(self._events) < self._limit:
                self._events[key] = DeviceEvent(
                    kind=kind,
                    index=index,
                    uuid=uuid,
                    code=code,
                    count=count,
                    first_wall=now,
                    last_wall=now,
                )
            else:
                self._dropped += count
                self._dropped_total += count

    def drain(self) -> tuple[DeviceEvent, ...]:
        """Every event since the last drain, oldest key first; empties the accumulator."""
        with self._lock:
            events = tuple(self._events.values())
            self._events = {}
            dropped, self._dropped = self._dropped, 0
        if dropped:
            log.warning(
                "device events dropped=%d: more than %d distinct GPU/code pairs between two cycles",
                dropped,
                self._limit,
            )
        return events

    @property
    def dropped_total(self) -> int:
        with self._lock:
            return self._dropped_total
