"""Device health: which faults a GPU has now, judged from what it said about itself.

The health model
----------------

A GPU is **UNHEALTHY** while it has an active fault, or while its last step
failed (capwatch could not enforce on it). A fault has a kind, a code, the
first and last time it was seen, and a count:

======================  =====================================  ==========================
kind                    raised by                              clears
======================  =====================================  ==========================
``xid``                 a critical XID event whose number the  no event of that number
                        policy counts (code: the XID number)   for the recovery window
``ecc_uncorrected``     a double-bit ECC event, or the         no new error for the
                        volatile uncorrected count going up    recovery window
``row_remap_failure``   the row-remapping read saying a remap  a read saying it no longer
                        failed                                 has (a reset, a repair)
``gpu_lost``            any call answering "GPU is lost", or   the UUID answering again
                        the UUID no longer answering           at an index
======================  =====================================  ==========================

Faults **recover**: health that never comes back is the device plugin's
best-known failing, and a GPU that was reset or repaired must read HEALTHY
again without an agent restart. Event-driven faults (XID, ECC) have nothing
to re-read, so they clear after a quiet window (``--fault-recovery``, default
10 minutes); state-driven ones clear when the state does.

The application-caused XIDs the NVIDIA device plugin ignores (13, 31, 43, 45,
68, 109: a program's own faults, not the device's) are ignored by default;
``--xid-ignore`` replaces that list (``all`` ignores every XID) and
``--xid-fatal`` names XIDs that are faults whatever the ignore list says.

A fault does not make the agent NotReady: readiness says whether capwatch is
enforcing caps, and a GPU with an XID still carries its cap. A fault that
stops enforcement (a lost GPU whose steps fail) fails the cycle, and that is
what readiness reports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from enum import Enum

from capwatch.agent.gpus import GpuErrorClass
from capwatch.agent.health.telemetry import DeviceEvent, DeviceEventKind, Readings
from capwatch.kit.errors import ConfigError

DEFAULT_XID_IGNORE: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})
DEFAULT_FAULT_RECOVERY_S = 600.0
_XID_MAX = 0xFFFF_FFFF  # NVML reports the XID as an unsigned long long; real ones are small
# Distinct fault keys kept per GPU: unknown XID numbers must not grow without bound.
FAULTS_PER_GPU_LIMIT = 32
# UUID-read failures that mean the device is gone, not that the call was refused.
_LOST_UUID_CLASSES = frozenset(
    {
        GpuErrorClass.GPU_IS_LOST,
        GpuErrorClass.NOT_FOUND,
        GpuErrorClass.RESET_REQUIRED,
        GpuErrorClass.UNKNOWN,
    }
)


class FaultKind(str, Enum):
    XID = "xid"
    GPU_LOST = "gpu_lost"
    ECC_UNCORRECTED = "ecc_uncorrected"
    ROW_REMAP_FAILURE = "row_remap_failure"

    @property
    def recovers_when_quiet(self) -> bool:
        """Cleared by the quiet window (nothing to re-read), not by a state read."""
        return self in (FaultKind.XID, FaultKind.ECC_UNCORRECTED)


@dataclass(frozen=True, kw_only=True)
class Fault:
    """One active fault of one GPU."""

    kind: FaultKind
    code: int  # the XID number; 0 for the other kinds
    first_seen_wall: float
    last_seen_wall: float
    count: int  # events (XID, ECC) or cycles it was observed in (the others)

    @property
    def summary(self) -> str:
        """Stable text naming the fault: no counts or times (the DRA mirrors' message)."""
        if self.kind is FaultKind.XID:
            return f"XID {self.code}"
        return _SUMMARIES[self.kind]


_SUMMARIES = {
    FaultKind.GPU_LOST: "GPU lost",
    FaultKind.ECC_UNCORRECTED: "uncorrectable ECC errors",
    FaultKind.ROW_REMAP_FAILURE: "row remapping failed",
}


@dataclass(frozen=True, kw_only=True)
class XidPolicy:
    """Which XID numbers are faults."""

    ignore: frozenset[int] = DEFAULT_XID_IGNORE
    ignore_all: bool = False
    fatal: frozenset[int] = frozenset()

    def is_fault(self, code: int) -> bool:
        return code in self.fatal or not (self.ignore_all or code in self.ignore)


def parse_xids(text: str, *, option: str, allow_all: bool) -> tuple[frozenset[int], bool]:
    """A comma-separated XID list ("" for none, ``all`` where allowed). Raises ConfigError."""
    stripped = text.strip()
    if allow_all and stripped.lower() == "all":
        return frozenset(), True
    codes: set[int] = set()
    for part in stripped.split(",") if stripped else ():
        item = part.strip()
        if not (item.isascii() and item.isdigit()) or not 0 < int(item) <= _XID_MAX:
            hint = ", or 'all'" if allow_all else ""
            raise ConfigError(
                option, f"{item!r} is not an XID number; expected numbers like 13,31,43{hint}"
            )
        codes.add(int(item))
    return frozenset(codes), False


@dataclass
class _GpuFaults:
    uuid: str
    active: dict[tuple[FaultKind, int], Fault]
    # Monotonic time each fault was last seen: the quiet window is not wall time.
    seen_at: dict[tuple[FaultKind, int], float]
    ecc_baseline: int | None = None


class FaultTracker:
    """Active faults per GPU, across cycles. Used by the cycle thread only.

    Each cycle calls :meth:`take_events` with the backend's drained events, then
    :meth:`observe` once per GPU it visited, which returns that GPU's active
    faults (sorted) after this cycle's evidence and recoveries.
    """

    def __init__(
        self,
        *,
        policy: XidPolicy | None = None,
        recovery_s: float = DEFAULT_FAULT_RECOVERY_S,
        wall: Callable[[], float],
        monotonic: Callable[[], float],
    ) -> None:
        self._policy = policy or XidPolicy()
        self._recovery_s = recovery_s
        self._wall = wall
        self._monotonic = monotonic
        self._gpus: dict[str, _GpuFaults] = {}  # by UUID: faults follow the device
        self._uuid_at: dict[int, str] = {}  # the last UUID each index answered with
        self._lost: set[str] = set()

    @property
    def policy(self) -> XidPolicy:
        return self._policy

    def identified(self, uuids: Mapping[int, str | None]) -> None:
        """UUIDs read outside a cycle (the agent's start-up inventory), by index."""
        for index, uuid in uuids.items():
            if uuid is not None:
                self._uuid_at[index] = uuid

    def take_events(self, events: Iterable[DeviceEvent]) -> None:
        for event in events:
            uuid = event.uuid or self._uuid_at.get(event.index)
            if uuid is None:
                continue  # a device never identified: nothing to attach the fault to
            if event.kind is DeviceEventKind.XID:
                if not self._policy.is_fault(event.code):
                    continue
                kind, code = FaultKind.XID, event.code
            else:
                kind, code = FaultKind.ECC_UNCORRECTED, 0
            self._raise(uuid, kind, code, count=event.count, first=event.first_wall)

    def observe(
        self,
        index: int,
        *,
        uuid: str | None,
        readings: Readings,
        error_class: GpuErrorClass | None,
        uuid_failed: bool,
    ) -> tuple[Fault, ...]:
        """Judge GPU ``index`` after its step: ``uuid`` is what it answered (None if the
        read failed), ``error_class`` the class of its step's failure, if any."""
        if uuid is not None:
            if uuid in self._lost:  # it answers again: the lost fault clears
                self._lost.discard(uuid)
                self._clear(uuid, FaultKind.GPU_LOST)
            self._uuid_at[index] = uuid
        known = uuid or self._uuid_at.get(index)
        if known is None:
            return ()
        lost = (
            readings.lost
            or error_class is GpuErrorClass.GPU_IS_LOST
            or (uuid_failed and error_class in _LOST_UUID_CLASSES)
        )
        if lost:
            self._lost.add(known)
            self._raise(known, FaultKind.GPU_LOST, 0, count=1)
        self._judge_readings(known, readings)
        return self._recover(known)

    def uuid_at(self, index: int) -> str | None:
        """The UUID GPU ``index`` last answered with (None: it never answered)."""
        return self._uuid_at.get(index)

    def active(self, uuid: str) -> tuple[Fault, ...]:
        """The faults the device ``uuid`` had at its last :meth:`observe` (none if unknown)."""
        gpu = self._gpus.get(uuid)
        if gpu is None:
            return ()
        return tuple(sorted(gpu.active.values(), key=lambda f: (f.kind.value, f.code)))

    def _judge_readings(self, uuid: str, readings: Readings) -> None:
        gpu = self._gpu(uuid)
        count = readings.ecc_uncorrected_volatile
        if count is not None:
            if gpu.ecc_baseline is not None and count > gpu.ecc_baseline:
                self._raise(uuid, FaultKind.ECC_UNCORRECTED, 0, count=count - gpu.ecc_baseline)
            gpu.ecc_baseline = count  # a reset zeroes the volatile count: a new baseline
        if readings.row_remap_failure is True:
            self._raise(uuid, FaultKind.ROW_REMAP_FAILURE, 0, count=1)
        elif readings.row_remap_failure is False:
            self._clear(uuid, FaultKind.ROW_REMAP_FAILURE)

    def _recover(self, uuid: str) -> tuple[Fault, ...]:
        gpu = self._gpus.get(uuid)
        if gpu is None:
            return ()
        now = self._monotonic()
        for key in [k for k in gpu.active if k[0].recovers_when_quiet]:
            if now - gpu.seen_at[key] >= self._recovery_s:
                del gpu.active[key], gpu.seen_at[key]
        return self.active(uuid)

    def _gpu(self, uuid: str) -> _GpuFaults:
        gpu = self._gpus.get(uuid)
        if gpu is None:
            gpu = self._gpus[uuid] = _GpuFaults(uuid=uuid, active={}, seen_at={})
        return gpu

    def _raise(
        self, uuid: str, kind: FaultKind, code: int, *, count: int, first: float | None = None
    ) -> None:
        gpu = self._gpu(uuid)
        key = (kind, code)
        now = self._wall()
        old = gpu.active.get(key)
        if old is None:
            if len(gpu.active) >= FAULTS_PER_GPU_LIMIT:
                # Make room by the longest-quiet XID; the other kinds are few and fixed.
                xids = [k for k in gpu.active if k[0] is FaultKind.XID]
                if not xids:
                    return
                stalest = min(xids, key=lambda k: gpu.seen_at[k])
                del gpu.active[stalest], gpu.seen_at[stalest]
            gpu.active[key] = Fault(
                kind=kind,
                code=code,
                first_seen_wall=now if first is None else min(first, now),
                last_seen_wall=now,
                count=count,
            )
        else:
            gpu.active[key] = replace(old, last_seen_wall=now, count=old.count + count)
        gpu.seen_at[key] = self._monotonic()

    def _clear(self, uuid: str, kind: FaultKind) -> None:
        gpu = self._gpus.get(uuid)
        if gpu is None:
            return
        for key in [k for k in gpu.active if k[0] is kind]:
            del gpu.active[key], gpu.seen_at[key]
