"""Per-GPU state across cycles: the latest result for each device, and its health.

The hub folds every CycleReport into this table, so a consumer that joins at
any time sees every GPU, including those the latest cycle did not reach (an
aborted or interrupted cycle reaches none or some). ``last_transition_wall``
moves only when a GPU's outcome, reason or set of active faults changes, so consumers can tell a new
failure from a persisting one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from capwatch.agent.reports import CycleReport, GpuResult
from capwatch.kit.readiness import Readiness, ReadinessReason


class DeviceHealth(str, Enum):
    UNKNOWN = "unknown"  # nothing reported yet, or the agent's reports are stale
    HEALTHY = "healthy"  # its last step completed and the device has no active fault
    UNHEALTHY = "unhealthy"  # its last step failed, or the device has a fault (agent.health.faults)


@dataclass(frozen=True, kw_only=True)
class DeviceState:
    index: int
    uuid: str | None
    result: GpuResult | None  # the latest step that reached this GPU; None: none yet
    sequence: int  # the cycle of that step (0: none)
    last_update_wall: float
    last_transition_wall: float


def inventory(uuids: Mapping[int, str | None], *, wall: float) -> dict[int, DeviceState]:
    """The table at start-up: every GPU known, none reported on yet."""
    return {
        index: DeviceState(
            index=index,
            uuid=uuid,
            result=None,
            sequence=0,
            last_update_wall=wall,
            last_transition_wall=wall,
        )
        for index, uuid in uuids.items()
    }


def fold(previous: Mapping[int, DeviceState], report: CycleReport) -> dict[int, DeviceState]:
    """The device table after ``report``. Pure; O(number of GPUs)."""
    table = dict(previous)
    for result in report.gpus:
        old = table.get(result.index)
        changed = (
            old is None
            or old.result is None
            or old.result.outcome is not result.outcome
            or old.result.reason is not result.reason
            or old.uuid != result.uuid
            or _fault_keys(old.result) != _fault_keys(result)
        )
        table[result.index] = DeviceState(
            index=result.index,
            uuid=result.uuid or (old.uuid if old else None),
            result=result,
            sequence=report.sequence,
            last_update_wall=report.finished_wall,
            last_transition_wall=report.finished_wall
            if changed or old is None
            else old.last_transition_wall,
        )
    return table


def device_health(
    state: DeviceState, *, latest: CycleReport | None, readiness: Readiness
) -> DeviceHealth:
    """What to say about one GPU now.

    UNKNOWN while the agent's reports are stale, before any cycle reached the
    GPU, and when the latest cycle aborted before reaching the GPUs (their
    state is not known to be current); otherwise the GPU's own last step decides.
    """
    if nothing_known(latest=latest, readiness=readiness):
        return DeviceHealth.UNKNOWN
    return own_health(state)


def nothing_known(*, latest: CycleReport | None, readiness: Readiness) -> bool:
    """The part of :func:`device_health` that holds for every GPU at once."""
    return readiness.reason in (ReadinessReason.STALE, ReadinessReason.NO_CYCLE_YET) or (
        latest is not None and latest.abort_reason is not None
    )


def own_health(state: DeviceState) -> DeviceHealth:
    """The part of :func:`device_health` that is the GPU's own."""
    if state.result is None:
        return DeviceHealth.UNKNOWN
    return DeviceHealth.HEALTHY if state.result.healthy else DeviceHealth.UNHEALTHY


def _fault_keys(result: GpuResult) -> frozenset[tuple[str, int]]:
    """What a transition is about: which faults, not how often they were seen."""
    return frozenset((f.kind.value, f.code) for f in result.faults)
