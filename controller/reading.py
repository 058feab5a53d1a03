"""What the controller keeps of an agent's stream messages: pure protobuf -> domain mappers.

A node's latest cycle is kept as a small :class:`~capwatch.controller.conditions.CycleSummary`
rather than the message itself (thousands of nodes, each cycle replacing the last),
its GPUs' strings interned: one copy of each UUID, code and message however many
cycles and nodes repeat them.
Its finishing instant is placed on this process's monotonic clock: the time the
message arrived less the cycle age the agent measured when it sent it, so neither
machine's wall clock is trusted and the network delay counts against freshness.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import replace

from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.controller.conditions import CycleSummary, GpuSummary

_OUTCOME = {
    pb.OUTCOME_ENFORCED: "enforced",
    pb.OUTCOME_IDLE: "idle",
    pb.OUTCOME_RELEASED: "released",
    pb.OUTCOME_FAILED: "failed",
    pb.OUTCOME_OBSERVED: "observed",
    pb.OUTCOME_LEFT: "left",
}
_HEALTH = {pb.DEVICE_HEALTH_HEALTHY: True, pb.DEVICE_HEALTH_UNHEALTHY: False}
_FAULT_KIND = {
    pb.FAULT_KIND_XID: "xid",
    pb.FAULT_KIND_GPU_LOST: "gpu_lost",
    pb.FAULT_KIND_ECC_UNCORRECTED: "ecc_uncorrected",
    pb.FAULT_KIND_ROW_REMAP_FAILURE: "row_remap_failure",
}
_ABORT = {
    pb.ABORT_REASON_POD_VIEW_NOT_SYNCED: "pod_view_not_synced",
    pb.ABORT_REASON_INTERNAL_ERROR: "internal_error",
}


def gpu_summaries(devices: Iterable[pb.DeviceStatus]) -> tuple[GpuSummary, ...]:
    return tuple(
        GpuSummary(
            index=d.index,
            # One copy of each: a cycle every 15 s brings the same UUIDs, codes and
            # messages ("capped at 250 W" on most GPUs of a fleet) as new strings.
            uuid=sys.intern(d.uuid),
            healthy=_HEALTH.get(d.health),
            outcome=_OUTCOME.get(d.outcome, "unknown"),
            reason=sys.intern(d.reason),
            message=sys.intern(d.message),
            applied_watts=d.applied_watts if d.HasField("applied_watts") else None,
            faults=tuple(f.summary for f in d.faults),
            fault_kinds=tuple(_FAULT_KIND.get(f.kind, "unknown") for f in d.faults),
            dra_device=_dra_device(d),
        )
        for d in sorted(devices, key=lambda d: d.index)
    )


def _dra_device(device: pb.DeviceStatus) -> tuple[str, str, str] | None:
    """The device its slice names it as, kept only while it has a fault (a rule may be
    written for it): at thousands of nodes, healthy GPUs' names would be memory spent on
    nothing."""
    if not device.faults or not device.dra_driver_name:
        return None
    return (
        sys.intern(device.dra_driver_name),
        sys.intern(device.dra_pool_name),
        sys.intern(device.dra_device_name),
    )


def cycle_age(readiness: pb.Readiness) -> float | None:
    """The age of the agent's latest cycle when it sent ``readiness`` (None: no cycle)."""
    if not readiness.HasField("last_cycle_age"):
        return None
    return readiness.last_cycle_age.ToTimedelta().total_seconds()


def cycle_summary(
    cycle: pb.CycleReport,
    *,
    devices: Iterable[pb.DeviceStatus],
    age_s: float | None,
    received_at: float,
) -> CycleSummary:
    """``cycle`` with the devices it reached, finishing ``age_s`` before ``received_at``."""
    return CycleSummary(
        sequence=cycle.sequence,
        enforced=cycle.enforced,
        abort_reason=_ABORT.get(cycle.abort_reason, ""),
        failure_kinds=tuple(f.kind for f in cycle.failures),
        failure_summary=cycle.failure_summary,
        observe=cycle.observe,
        gpus=gpu_summaries(devices),
        finished_at=received_at - max(0.0, age_s or 0.0),
        finished_wall=cycle.finished.seconds + cycle.finished.nanos / 1e9,
    )


def merged(table: tuple[GpuSummary, ...], update: Iterable[GpuSummary]) -> tuple[GpuSummary, ...]:
    """Every GPU as its latest report says: ``table`` with ``update``'s GPUs replaced.

    A GPU the update reports as the table already has it keeps the table's object: a
    cycle every 15 s mostly repeats the last, and its copies would otherwise live on in
    whatever still holds the previous state (5,000 nodes x 8 GPUs: about 4 MiB)."""
    by_index = {g.index: g for g in table}
    for gpu in update:
        if by_index.get(gpu.index) != gpu:
            by_index[gpu.index] = gpu
    return tuple(by_index[i] for i in sorted(by_index))


def sharing(cycle: CycleSummary, table: tuple[GpuSummary, ...]) -> CycleSummary:
    """``cycle`` with each of its GPUs that ``table`` holds alike as ``table``'s object."""
    by_index = {g.index: g for g in table}
    gpus = tuple(g if by_index.get(g.index) != g else by_index[g.index] for g in cycle.gpus)
    return replace(cycle, gpus=gpus)
