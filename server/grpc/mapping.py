"""Pure mappers from the agent's domain values to capwatch.v1 protobuf messages.

Nothing here does I/O or reads a clock: every age and timestamp is passed in,
so each mapper is a function of its arguments and is table-tested.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from capwatch.agent.devices import DeviceHealth, DeviceState, device_health, nothing_known
from capwatch.agent.health.faults import Fault, FaultKind
from capwatch.agent.health.telemetry import Readings
from capwatch.agent.reports import (
    AbortReason,
    CapSource,
    ClampDirection,
    CycleReport,
    GpuResult,
    Outcome,
    SafeDefaultCause,
)
from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.kit.readiness import Readiness, ReadinessReason

DeviceNamer = Callable[[int, str | None], str]
# Which devices a subscriber asked for, by index and UUID; None: all of them.
Include = Callable[[int, str | None], bool]

# Enum members as module constants: a class attribute lookup on an Enum costs
# ten times as much on Python 3.11, and cycle_devices makes several per GPU.
_UNKNOWN, _HEALTHY, _UNHEALTHY = DeviceHealth.UNKNOWN, DeviceHealth.HEALTHY, DeviceHealth.UNHEALTHY
_FAILED = Outcome.FAILED

_UINT32_MAX = 0xFFFF_FFFF
_UINT64_MAX = 0xFFFF_FFFF_FFFF_FFFF

# Reason code of a GPU known at start-up that no cycle has reached yet.
NOT_REPORTED = "not_reported"

READINESS_REASON: Mapping[ReadinessReason, pb.ReadinessReason.ValueType] = {
    ReadinessReason.READY: pb.READINESS_REASON_READY,
    ReadinessReason.NO_CYCLE_YET: pb.READINESS_REASON_NO_CYCLE_YET,
    ReadinessReason.CYCLE_FAILED: pb.READINESS_REASON_CYCLE_FAILED,
    ReadinessReason.STALE: pb.READINESS_REASON_STALE,
    ReadinessReason.STATE_UNWRITABLE: pb.READINESS_REASON_STATE_UNWRITABLE,
    # The agent never reports stream-lost about itself; consumers do.
    ReadinessReason.STREAM_LOST: pb.READINESS_REASON_UNSPECIFIED,
}
ABORT_REASON: Mapping[AbortReason | None, pb.AbortReason.ValueType] = {
    None: pb.ABORT_REASON_NONE,
    AbortReason.POD_VIEW_NOT_SYNCED: pb.ABORT_REASON_POD_VIEW_NOT_SYNCED,
    AbortReason.INTERNAL_ERROR: pb.ABORT_REASON_INTERNAL_ERROR,
}
DEVICE_HEALTH: Mapping[DeviceHealth, pb.DeviceHealth.ValueType] = {
    DeviceHealth.UNKNOWN: pb.DEVICE_HEALTH_UNKNOWN,
    DeviceHealth.HEALTHY: pb.DEVICE_HEALTH_HEALTHY,
    DeviceHealth.UNHEALTHY: pb.DEVICE_HEALTH_UNHEALTHY,
}
OUTCOME: Mapping[Outcome, pb.Outcome.ValueType] = {
    Outcome.ENFORCED: pb.OUTCOME_ENFORCED,
    Outcome.IDLE: pb.OUTCOME_IDLE,
    Outcome.RELEASED: pb.OUTCOME_RELEASED,
    Outcome.FAILED: pb.OUTCOME_FAILED,
    Outcome.OBSERVED: pb.OUTCOME_OBSERVED,
    Outcome.LEFT: pb.OUTCOME_LEFT,
}
CAP_SOURCE: Mapping[CapSource | None, pb.CapSource.ValueType] = {
    None: pb.CAP_SOURCE_UNSPECIFIED,
    CapSource.ANNOTATION: pb.CAP_SOURCE_ANNOTATION,
    CapSource.AGREED: pb.CAP_SOURCE_AGREED,
    CapSource.SAFE_DEFAULT: pb.CAP_SOURCE_SAFE_DEFAULT,
    CapSource.CLAIM: pb.CAP_SOURCE_CLAIM,
}
SAFE_DEFAULT_CAUSE: Mapping[SafeDefaultCause | None, pb.SafeDefaultCause.ValueType] = {
    None: pb.SAFE_DEFAULT_CAUSE_UNSPECIFIED,
    SafeDefaultCause.MISSING: pb.SAFE_DEFAULT_CAUSE_MISSING,
    SafeDefaultCause.INVALID: pb.SAFE_DEFAULT_CAUSE_INVALID,
    SafeDefaultCause.DISAGREE: pb.SAFE_DEFAULT_CAUSE_DISAGREE,
    SafeDefaultCause.NO_POD: pb.SAFE_DEFAULT_CAUSE_NO_POD,
}
FAULT_KIND: Mapping[FaultKind, pb.FaultKind.ValueType] = {
    FaultKind.XID: pb.FAULT_KIND_XID,
    FaultKind.GPU_LOST: pb.FAULT_KIND_GPU_LOST,
    FaultKind.ECC_UNCORRECTED: pb.FAULT_KIND_ECC_UNCORRECTED,
    FaultKind.ROW_REMAP_FAILURE: pb.FAULT_KIND_ROW_REMAP_FAILURE,
}
CLAMP_DIRECTION: Mapping[ClampDirection, pb.ClampDirection.ValueType] = {
    ClampDirection.NONE: pb.CLAMP_DIRECTION_NONE,
    ClampDirection.RAISED_TO_MIN: pb.CLAMP_DIRECTION_RAISED_TO_MIN,
    ClampDirection.LOWERED_TO_MAX: pb.CLAMP_DIRECTION_LOWERED_TO_MAX,
    ClampDirection.RAISED_TO_FLOOR: pb.CLAMP_DIRECTION_RAISED_TO_FLOOR,
    ClampDirection.LOWERED_TO_CEILING: pb.CLAMP_DIRECTION_LOWERED_TO_CEILING,
}


def duration_parts(seconds: float) -> tuple[int, int]:
    """Seconds and nanos of a non-negative duration (ages never go backwards on a
    monotonic clock)."""
    return divmod(max(0, round(seconds * 1e9)), 1_000_000_000)


def duration(seconds: float) -> Duration:
    whole, nanos = duration_parts(seconds)
    return Duration(seconds=whole, nanos=nanos)


def timestamp_parts(wall: float) -> tuple[int, int]:
    """Seconds and nanos of a wall-clock time, nanos in [0, 1e9)."""
    # Split before scaling: wall * 1e9 is past a float's exact-integer range.
    whole = math.floor(wall)
    carry, nanos = divmod(round((wall - whole) * 1e9), 1_000_000_000)
    return whole + carry, nanos


def timestamp(wall: float) -> Timestamp:
    whole, nanos = timestamp_parts(wall)
    return Timestamp(seconds=whole, nanos=nanos)


def readiness(ready: Readiness, *, last_cycle_age_s: float | None) -> pb.Readiness:
    message = pb.Readiness(
        ready=ready.ready, reason=READINESS_REASON[ready.reason], detail=ready.detail
    )
    if ready.last_good_age_s is not None:
        message.last_good_cycle_age.CopyFrom(duration(ready.last_good_age_s))
    if last_cycle_age_s is not None:
        message.last_cycle_age.CopyFrom(duration(last_cycle_age_s))
    return message


def gpu_result(
    result: GpuResult,
    *,
    dra_device_name: str,
    health: DeviceHealth,
    sequence: int,
    last_update_wall: float,
    last_transition_wall: float,
) -> pb.DeviceStatus:
    message = pb.DeviceStatus()
    message.CopyFrom(settled(result, dra_device_name, health, last_transition_wall))
    message.sequence = sequence
    message.last_update_time.CopyFrom(timestamp(last_update_wall))
    return message


@functools.lru_cache(maxsize=4096)
def settled(
    result: GpuResult, dra_device_name: str, health: DeviceHealth, last_transition_wall: float
) -> pb.DeviceStatus:
    """Everything about a GPU's step but what moves every cycle (sequence, update time).

    A GPU usually reports the same result cycle after cycle; building its
    message once and copying it costs a fraction of building it each time.
    Callers copy the cached message and never hand it out.
    """
    message = pb.DeviceStatus(
        index=result.index,
        uuid=result.uuid or "",
        dra_device_name=dra_device_name,
        health=DEVICE_HEALTH[health],
        outcome=OUTCOME[result.outcome],
        reason=result.reason.value,
        error_class=result.error_class.value if result.error_class else "",
        message=result.message,
        owners=[pb.PodRef(namespace=p.namespace, name=p.name, uid=p.uid) for p in result.owners],
        cap_source=CAP_SOURCE[result.cap_source],
        safe_default_cause=SAFE_DEFAULT_CAUSE[result.safe_default_cause],
        clamp_direction=CLAMP_DIRECTION[result.clamp],
        last_transition_time=timestamp(last_transition_wall),
        process_count=result.process_count,
    )
    if result.requested_watts is not None:
        message.requested_watts = result.requested_watts
    if result.resolved_watts is not None:
        message.resolved_watts = result.resolved_watts
    if result.applied_watts is not None:
        message.applied_watts = result.applied_watts
    if result.intended_watts is not None:
        message.intended_watts = result.intended_watts
    message.faults.extend(fault(f) for f in result.faults)
    if result.readings is not None:
        message.telemetry.CopyFrom(telemetry(result.readings))
    message.claims.extend(
        pb.ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in result.claims
    )
    if result.dra_device is not None:
        message.dra_pool_name = result.dra_device.pool
        message.dra_driver_name = result.dra_device.driver
    return message


def dra_device_name(
    result: GpuResult | None, index: int, uuid: str | None, namer: DeviceNamer
) -> str:
    """The name the DRA mirrors give the GPU: its driver's, from the ResourceSlice that
    names it, else the ``--dra-device-name`` template's."""
    if result is not None and result.dra_device is not None:
        return result.dra_device.device
    return namer(index, uuid)


def dra_pool_name(result: GpuResult | None, default: str) -> str:
    """The pool the DRA mirrors name the GPU in: its driver's, else ``default``."""
    if result is not None and result.dra_device is not None:
        return result.dra_device.pool
    return default


def fault(value: Fault) -> pb.DeviceFault:
    return pb.DeviceFault(
        kind=FAULT_KIND[value.kind],
        code=min(value.code, _UINT32_MAX),
        first_seen_time=timestamp(value.first_seen_wall),
        last_seen_time=timestamp(value.last_seen_wall),
        count=value.count,
        summary=value.summary,
    )


def telemetry(readings: Readings) -> pb.DeviceTelemetry:
    message = pb.DeviceTelemetry(
        throttle_reasons=[r.value for r in readings.throttle_reasons or ()],
        throttle_reasons_available=readings.throttle_reasons is not None,
        failed_reads=readings.failed_reads,
    )
    if readings.power_draw_milliwatts is not None:
        message.power_draw_milliwatts = _uint32(readings.power_draw_milliwatts)
    if readings.enforced_limit_milliwatts is not None:
        message.enforced_limit_milliwatts = _uint32(readings.enforced_limit_milliwatts)
    if readings.ecc_uncorrected_volatile is not None:
        message.ecc_uncorrected_volatile = max(
            0, min(readings.ecc_uncorrected_volatile, _UINT64_MAX)
        )
    if readings.row_remap_pending is not None:
        message.row_remap_pending = readings.row_remap_pending
    if readings.row_remap_failure is not None:
        message.row_remap_failure = readings.row_remap_failure
    if readings.retired_pages_pending is not None:
        message.retired_pages_pending = readings.retired_pages_pending
    return message


def _uint32(value: int) -> int:
    """A device's number into a uint32 field: clamped, never wrapped or raised on."""
    return max(0, min(value, _UINT32_MAX))


def device_state(
    state: DeviceState,
    *,
    namer: DeviceNamer,
    latest: CycleReport | None,
    ready: Readiness,
) -> pb.DeviceStatus:
    if state.result is None:
        return pb.DeviceStatus(
            index=state.index,
            uuid=state.uuid or "",
            dra_device_name=namer(state.index, state.uuid),
            health=pb.DEVICE_HEALTH_UNKNOWN,
            outcome=pb.OUTCOME_UNSPECIFIED,
            reason=NOT_REPORTED,
            message="no cycle has reached this GPU yet",
            last_transition_time=timestamp(state.last_transition_wall),
            last_update_time=timestamp(state.last_update_wall),
        )
    return gpu_result(
        state.result,
        dra_device_name=dra_device_name(state.result, state.index, state.uuid, namer),
        health=device_health(state, latest=latest, readiness=ready),
        sequence=state.sequence,
        last_update_wall=state.last_update_wall,
        last_transition_wall=state.last_transition_wall,
    )


def cycle_devices(
    report: CycleReport,
    *,
    devices: Mapping[int, DeviceState],
    ready: Readiness,
    include: Include | None = None,
) -> list[tuple[GpuResult, float, DeviceHealth]]:
    """Each GPU of ``report`` that ``include`` admits (None: all), with its last
    transition time and its health.

    The transition time is the device table's, for this cycle; without an
    entry for it, the cycle's own finish is the best transition time there is.
    (A list, not a generator: every cycle message is built from it, and for a
    handful of GPUs a list is the cheaper of the two.)
    """
    unknown = nothing_known(latest=report, readiness=ready)
    sequence, finished = report.sequence, report.finished_wall
    out = []
    for result in report.gpus:
        if include is not None and not include(result.index, result.uuid):
            continue
        state = devices.get(result.index)
        transition = (
            finished if state is None or state.sequence != sequence else state.last_transition_wall
        )
        # own_health() of this cycle's state, whose result is this one.
        health = (
            _UNKNOWN
            if unknown
            else _UNHEALTHY
            if result.outcome is _FAILED or result.faults
            else _HEALTHY
        )
        out.append((result, transition, health))
    return out


def cycle(
    report: CycleReport,
    *,
    devices: Mapping[int, DeviceState],
    namer: DeviceNamer,
    ready: Readiness,
    age_s: float,
    include: Include | None = None,
) -> pb.CycleReport:
    """One cycle; its devices carry their transition times from the device table."""
    finished = timestamp(report.finished_wall)
    message = pb.CycleReport(
        sequence=report.sequence,
        started=timestamp(report.started_wall),
        finished=finished,
        duration=duration(report.duration_s),
        enforced=report.enforced,
        abort_reason=ABORT_REASON[report.abort_reason],
        failures=[pb.CycleFailure(kind=f.kind.value, message=f.message) for f in report.failures],
        readiness=readiness(ready, last_cycle_age_s=age_s),
        interrupted=report.interrupted,
        failure_summary=report.failure_summary,
        observe=report.observe,
    )
    for result, transition, health in cycle_devices(
        report, devices=devices, ready=ready, include=include
    ):
        device = message.devices.add()
        name = dra_device_name(result, result.index, result.uuid, namer)
        device.CopyFrom(settled(result, name, health, transition))
        device.sequence = report.sequence
        device.last_update_time.CopyFrom(finished)
    return message


def snapshot(
    *,
    node_name: str,
    instance_id: str,
    interval_s: float,
    stale_after_s: float,
    sequence: int,
    latest: CycleReport | None,
    devices: Mapping[int, DeviceState],
    namer: DeviceNamer,
    ready: Readiness,
    last_cycle_age_s: float | None,
    resync: bool = False,
    include: Include | None = None,
) -> pb.NodeSnapshot:
    message = pb.NodeSnapshot(
        node_name=node_name,
        agent_instance_id=instance_id,
        interval=duration(interval_s),
        stale_after=duration(stale_after_s),
        readiness=readiness(ready, last_cycle_age_s=last_cycle_age_s),
        devices=[
            device_state(state, namer=namer, latest=latest, ready=ready)
            for state in _sorted(devices.values())
            if include is None or include(state.index, state.uuid)
        ],
        resync=resync,
        sequence=sequence,
    )
    if latest is not None:
        message.last_cycle.CopyFrom(
            cycle(
                latest,
                devices=devices,
                namer=namer,
                ready=ready,
                age_s=last_cycle_age_s or 0.0,
                include=include,
            )
        )
    return message


def heartbeat(
    *,
    wall: float,
    sequence: int,
    instance_id: str,
    ready: Readiness,
    last_cycle_age_s: float | None,
) -> pb.Heartbeat:
    return pb.Heartbeat(
        time=timestamp(wall),
        last_sequence=sequence,
        agent_instance_id=instance_id,
        readiness=readiness(ready, last_cycle_age_s=last_cycle_age_s),
    )


def _sorted(states: Iterable[DeviceState]) -> list[DeviceState]:
    return sorted(states, key=lambda s: s.index)
