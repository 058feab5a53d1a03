"""Human-readable text for capwatch.v1 and DRA health messages (``capwatch watch``).

The look of agent/rendering.py's cycle table (what the demo prints), rendered
from the protobuf messages a remote agent sends, plus a HEALTH column. Wall
clock times are local and for humans only; ages are the agent's, at send time.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from server.gen.capwatch.v1 import node_health_pb2 as pb
from server.gen.v1 import dra_health_pb2 as v1_pb
from server.gen.v1alpha1 import dra_health_pb2 as v1alpha1_pb

_GPU_COLUMNS = (
    "GPU",
    "HEALTH",
    "UUID",
    "OUTCOME",
    "REASON",
    "OWNERS",
    "REQ W",
    "RES W",
    "APPLIED",
    "SOURCE",
)
_DRA_COLUMNS = ("POOL", "DEVICE", "HEALTH", "UPDATED", "TIMEOUT", "MESSAGE")
# The kubelet's HealthStatus numbers, the same in v1alpha1 and v1.
_DRA_HEALTH = {0: "unknown", 1: "healthy", 2: "unhealthy"}


def render_cycle(cycle: pb.CycleReport) -> str:
    """A heading line (sequence, time, verdict, readiness), then one row per GPU."""
    verdict = "ENFORCED" if cycle.enforced else "NOT ENFORCED"
    millis = cycle.duration.ToTimedelta().total_seconds() * 1000
    head = f"cycle {cycle.sequence}  {_clock(cycle.finished)}  {verdict}  {millis:.1f} ms"
    if cycle.abort_reason not in (pb.ABORT_REASON_UNSPECIFIED, pb.ABORT_REASON_NONE):
        head += f"  aborted: {_enum(pb.AbortReason, cycle.abort_reason, 'ABORT_REASON_')}"
    if cycle.interrupted:
        head += "  (interrupted by shutdown)"
    lines = [f"{head}  {render_readiness(cycle.readiness)}"]
    lines += [f"  ! {failure.message}" for failure in cycle.failures]
    lines += _table(_GPU_COLUMNS, [_gpu_row(device) for device in cycle.devices])
    return "\n".join(lines)


def render_snapshot(snapshot: pb.NodeSnapshot) -> str:
    """The node's state: a heading line, then one row per GPU as of its last report."""
    interval = snapshot.interval.ToTimedelta().total_seconds()
    head = (
        f"snapshot{' (resync)' if snapshot.resync else ''}  node {snapshot.node_name}  "
        f"agent {snapshot.agent_instance_id[:8]}  cycle {snapshot.sequence}  "
        f"every {interval:g}s  {render_readiness(snapshot.readiness)}"
    )
    lines = [head]
    lines += _table(_GPU_COLUMNS, [_gpu_row(device) for device in snapshot.devices])
    return "\n".join(lines)


def render_heartbeat(heartbeat: pb.Heartbeat) -> str:
    return (
        f"heartbeat  {_clock(heartbeat.time)}  cycle {heartbeat.last_sequence}  "
        f"{render_readiness(heartbeat.readiness)}"
    )


def render_readiness(readiness: pb.Readiness) -> str:
    """``ready`` or ``NOT READY: <reason> (<detail>)``, and the last good cycle's age."""
    if readiness.ready:
        text = "ready"
    else:
        # Spelled as the agent, the shim and the logs spell it (cycle-failed).
        reason = _enum(pb.ReadinessReason, readiness.reason, "READINESS_REASON_").replace("_", "-")
        text = f"NOT READY: {reason}" + (f" ({readiness.detail})" if readiness.detail else "")
    if readiness.HasField("last_good_cycle_age"):
        age = readiness.last_good_cycle_age.ToTimedelta().total_seconds()
        return f"{text}, last good cycle {age:.1f}s ago"
    return f"{text}, no good cycle yet"


def render_devices(
    response: v1_pb.NodeWatchResourcesResponse | v1alpha1_pb.NodeWatchResourcesResponse,
    *,
    version: str,
) -> str:
    """A DRA device list as the kubelet receives it: one row per device."""
    rows = [
        (
            device.device.pool_name,
            device.device.device_name,
            _DRA_HEALTH.get(device.health, str(device.health)),
            time.strftime("%H:%M:%S", time.localtime(device.last_updated_time)),
            f"{device.health_check_timeout_seconds}s",
            device.message,
        )
        for device in response.devices
    ]
    head = f"DRA {version} device list  {len(rows)} devices"
    return "\n".join([head, *_table(_DRA_COLUMNS, rows)])


def _table(columns: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    table = [tuple(columns), *(tuple(row) for row in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
    return [
        "  "
        + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in table
    ]


def _gpu_row(device: pb.DeviceStatus) -> tuple[str, ...]:
    applied = "-"
    if device.HasField("applied_watts"):
        applied = f"{device.applied_watts} W"
        if device.clamp_direction == pb.CLAMP_DIRECTION_LOWERED_TO_MAX:
            applied += " (max)"
        elif device.clamp_direction == pb.CLAMP_DIRECTION_RAISED_TO_MIN:
            applied += " (min)"
    source = _enum(pb.CapSource, device.cap_source, "CAP_SOURCE_")
    if device.safe_default_cause != pb.SAFE_DEFAULT_CAUSE_UNSPECIFIED:
        source += "/" + _enum(pb.SafeDefaultCause, device.safe_default_cause, "SAFE_DEFAULT_CAUSE_")
    reason = device.reason or "-"
    if device.error_class:
        reason += f":{device.error_class}"
    return (
        str(device.index),
        _enum(pb.DeviceHealth, device.health, "DEVICE_HEALTH_"),
        _short_uuid(device.uuid),
        _enum(pb.Outcome, device.outcome, "OUTCOME_"),
        reason,
        ",".join(_pod(owner) for owner in device.owners) or "-",
        str(device.requested_watts) if device.HasField("requested_watts") else "-",
        str(device.resolved_watts) if device.HasField("resolved_watts") else "-",
        applied,
        source,
    )


def _enum(kind: Any, value: int, prefix: str) -> str:
    """``OUTCOME_ENFORCED`` -> ``enforced``; unset -> ``-``; unknown (newer agent) -> number."""
    try:
        name: str = kind.Name(value)
    except ValueError:
        return str(value)
    return "-" if name.endswith("_UNSPECIFIED") else name.removeprefix(prefix).lower()


def _pod(ref: pb.PodRef) -> str:
    return f"{ref.namespace}/{ref.name}" if ref.name else f"uid:{ref.uid[:8]}"


def _short_uuid(uuid: str) -> str:
    if not uuid:
        return "?"
    # UUIDs share long prefixes; the tail is what tells GPUs apart.
    return uuid if len(uuid) <= 16 else uuid[:4] + "…" + uuid[-8:]


def _clock(stamp: Timestamp) -> str:
    if stamp.seconds == 0 and stamp.nanos == 0:
        return "--:--:--"
    return time.strftime("%H:%M:%S", time.localtime(stamp.seconds))
