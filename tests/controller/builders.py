"""Domain values and capwatch.v1 messages for the controller tests, with plain defaults."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.client.stream_events import Cycle, Disconnected, Heartbeat, Snapshot
from capwatch.controller.conditions import AgentLink, CycleSummary, GpuSummary, NodeObservation

UUID = "GPU-00000000-0000-4000-8000-{:012d}"


def gpu(
    index: int,
    *,
    outcome: str = "enforced",
    reason: str = "ok",
    message: str = "capped at 300 W",
    uuid: str | None = None,
    healthy: bool | None = True,
) -> GpuSummary:
    return GpuSummary(
        index=index,
        uuid=UUID.format(index) if uuid is None else uuid,
        healthy=healthy,
        outcome=outcome,
        reason=reason,
        message=message,
    )


def failed_gpu(index: int, reason: str, message: str = "it failed") -> GpuSummary:
    return gpu(index, outcome="failed", reason=reason, message=message, healthy=False)


def cycle(
    *,
    enforced: bool = True,
    gpus: Sequence[GpuSummary] = (),
    abort_reason: str = "",
    failure_kinds: Sequence[str] = (),
    failure_summary: str = "",
    finished_at: float = 100.0,
    sequence: int = 1,
    observe: bool = False,
) -> CycleSummary:
    return CycleSummary(
        sequence=sequence,
        observe=observe,
        enforced=enforced,
        abort_reason=abort_reason,
        failure_kinds=tuple(failure_kinds),
        failure_summary=failure_summary,
        gpus=tuple(gpus),
        finished_at=finished_at,
        finished_wall=1_750_000_000.0,
    )


def observation(
    link: AgentLink = AgentLink.CONNECTED,
    *,
    node: str = "gpu-1",
    cycle: CycleSummary | None = None,
    stale_after_s: float | None = 45.0,
    address: str = "10.0.0.1:50051",
    link_error: str = "",
) -> NodeObservation:
    return NodeObservation(
        node=node,
        link=link,
        address=address,
        link_error=link_error,
        stale_after_s=stale_after_s,
        cycle=cycle,
    )


# --- capwatch.v1 messages -----------------------------------------------------------------


def duration(seconds: float) -> Duration:
    value = Duration()
    value.FromTimedelta(timedelta(seconds=seconds))
    return value


def timestamp(wall: float) -> Timestamp:
    value = Timestamp()
    value.FromNanoseconds(round(wall * 1e9))
    return value


def device(
    index: int,
    *,
    outcome: pb.Outcome.ValueType = pb.OUTCOME_ENFORCED,
    reason: str = "ok",
    message: str = "capped at 300 W",
    health: pb.DeviceHealth.ValueType = pb.DEVICE_HEALTH_HEALTHY,
    applied_watts: int | None = 300,
) -> pb.DeviceStatus:
    status = pb.DeviceStatus(
        index=index,
        uuid=UUID.format(index),
        outcome=outcome,
        reason=reason,
        message=message,
        health=health,
    )
    if applied_watts is not None:
        status.applied_watts = applied_watts
    return status


def failed_device(index: int, reason: str = "write_failed", message: str = "no") -> pb.DeviceStatus:
    return device(
        index,
        outcome=pb.OUTCOME_FAILED,
        reason=reason,
        message=message,
        health=pb.DEVICE_HEALTH_UNHEALTHY,
        applied_watts=None,
    )


def readiness(*, age_s: float | None, ready: bool = True) -> pb.Readiness:
    value = pb.Readiness(ready=ready)
    if age_s is not None:
        value.last_cycle_age.CopyFrom(duration(age_s))
    return value


def report(
    sequence: int = 1,
    *,
    devices: Sequence[pb.DeviceStatus] = (),
    enforced: bool | None = None,
    abort: pb.AbortReason.ValueType = pb.ABORT_REASON_NONE,
    failures: Sequence[str] = (),
    failure_summary: str = "",
    age_s: float | None = 0.0,
    finished_wall: float = 1_750_000_000.25,
) -> pb.CycleReport:
    """A cycle report; enforced by default unless a device or a failure says otherwise."""
    if enforced is None:
        enforced = not failures and all(d.outcome != pb.OUTCOME_FAILED for d in devices)
    return pb.CycleReport(
        sequence=sequence,
        enforced=enforced,
        abort_reason=abort,
        failures=[pb.CycleFailure(kind=k, message=f"{k} happened") for k in failures],
        failure_summary=failure_summary,
        devices=list(devices),
        readiness=readiness(age_s=age_s, ready=enforced),
        finished=timestamp(finished_wall),
    )


def snapshot(
    node: str = "gpu-1",
    *,
    last_cycle: pb.CycleReport | None = None,
    age_s: float | None = 0.0,
    devices: Sequence[pb.DeviceStatus] | None = None,
    stale_after_s: float = 45.0,
    instance: str = "instance-a",
) -> pb.NodeSnapshot:
    value = pb.NodeSnapshot(
        node_name=node,
        agent_instance_id=instance,
        interval=duration(stale_after_s / 3),
        stale_after=duration(stale_after_s),
        readiness=readiness(age_s=age_s if last_cycle is not None else None),
        sequence=0 if last_cycle is None else last_cycle.sequence,
    )
    if last_cycle is not None:
        value.last_cycle.CopyFrom(last_cycle)
    listed = list(last_cycle.devices) if devices is None and last_cycle else list(devices or [])
    value.devices.extend(listed)
    return value


def snapshot_event(snap: pb.NodeSnapshot, *, at: float) -> Snapshot:
    return Snapshot(snapshot=snap, resync=False, restarted=False, received_at=at)


def cycle_event(cycle_report: pb.CycleReport, *, at: float) -> Cycle:
    return Cycle(cycle=cycle_report, received_at=at)


def heartbeat_event(*, at: float, sequence: int = 1) -> Heartbeat:
    return Heartbeat(
        heartbeat=pb.Heartbeat(last_sequence=sequence, agent_instance_id="instance-a"),
        received_at=at,
    )


def disconnected_event(
    error: str = "connection refused",
    *,
    at: float,
    code: grpc.StatusCode | None = grpc.StatusCode.UNAVAILABLE,
    malformed: bool = False,
) -> Disconnected:
    return Disconnected(
        error=error, code=code, retry_in=1.0, attempt=0, received_at=at, malformed=malformed
    )
