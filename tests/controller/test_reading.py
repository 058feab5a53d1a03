"""capwatch.v1 messages to the controller's summaries (controller/reading.py): GPUs, the
cycle placed on this process's monotonic clock, and the merged per-GPU table."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest

from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.controller.conditions import GpuSummary
from capwatch.controller.reading import cycle_age, cycle_summary, gpu_summaries, merged, sharing
from tests.controller.builders import device, failed_device, gpu, readiness, report


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        (pb.OUTCOME_ENFORCED, "enforced"),
        (pb.OUTCOME_IDLE, "idle"),
        (pb.OUTCOME_RELEASED, "released"),
        (pb.OUTCOME_FAILED, "failed"),
        (pb.OUTCOME_UNSPECIFIED, "unknown"),
    ],
)
def test_gpu_outcomes(outcome: pb.Outcome.ValueType, expected: str) -> None:
    """Each Outcome becomes its stable word; an unset one is "unknown", never "enforced"."""
    (summary,) = gpu_summaries([device(0, outcome=outcome)])
    assert summary.outcome == expected


@pytest.mark.parametrize(
    ("health", "expected"),
    [
        (pb.DEVICE_HEALTH_HEALTHY, True),
        (pb.DEVICE_HEALTH_UNHEALTHY, False),
        (pb.DEVICE_HEALTH_UNKNOWN, None),
        (pb.DEVICE_HEALTH_UNSPECIFIED, None),
    ],
)
def test_gpu_health(health: pb.DeviceHealth.ValueType, expected: bool | None) -> None:
    """Healthy and unhealthy are booleans; unknown or unset health is None."""
    (summary,) = gpu_summaries([device(0, health=health)])
    assert summary.healthy is expected


def test_gpu_fields_and_order() -> None:
    """Index, UUID, reason and message are copied; applied_watts is None only when the
    agent left it unset (0 W is a value); GPUs come out in index order."""
    summaries = gpu_summaries(
        [
            failed_device(3, "write_failed", "no permission"),
            device(1, applied_watts=0),
            device(0, applied_watts=250),
        ]
    )
    assert [s.index for s in summaries] == [0, 1, 3]
    assert summaries[0] == GpuSummary(
        index=0,
        uuid="GPU-00000000-0000-4000-8000-000000000000",
        healthy=True,
        outcome="enforced",
        reason="ok",
        message="capped at 300 W",
        applied_watts=250,
    )
    assert summaries[1].applied_watts == 0
    assert summaries[2].applied_watts is None
    assert (summaries[2].reason, summaries[2].message) == ("write_failed", "no permission")


def test_cycle_age() -> None:
    """The age the agent measured at send time, in seconds; None when it had no cycle."""
    assert cycle_age(readiness(age_s=None)) is None
    assert cycle_age(readiness(age_s=0.0)) == 0.0
    assert cycle_age(readiness(age_s=2.5)) == 2.5


def test_cycle_finishes_the_reported_age_before_it_was_received() -> None:
    """finished_at = received_at - the age the agent reported (this process's clock)."""
    summary = cycle_summary(report(), devices=[], age_s=1.25, received_at=500.0)
    assert summary.finished_at == 498.75


@pytest.mark.parametrize("age", [None, 0.0, -3.0])
def test_cycle_without_a_positive_age_finishes_when_received(age: float | None) -> None:
    """No age, or a negative one, never places a cycle in the future."""
    summary = cycle_summary(report(), devices=[], age_s=age, received_at=500.0)
    assert summary.finished_at == 500.0


@pytest.mark.parametrize(
    ("abort", "expected"),
    [
        (pb.ABORT_REASON_UNSPECIFIED, ""),
        (pb.ABORT_REASON_NONE, ""),
        (pb.ABORT_REASON_POD_VIEW_NOT_SYNCED, "pod_view_not_synced"),
        (pb.ABORT_REASON_INTERNAL_ERROR, "internal_error"),
    ],
)
def test_cycle_abort_reasons(abort: pb.AbortReason.ValueType, expected: str) -> None:
    """Abort reasons become the agent's stable codes; none (or unset) is ""."""
    message = report(abort=abort, enforced=False)
    assert cycle_summary(message, devices=[], age_s=0, received_at=1).abort_reason == expected


def test_cycle_summary_fields() -> None:
    """Sequence, enforced, failure kinds in order, the failure summary, the wall finish
    and the GPUs it reached (from the devices given) are kept."""
    message = report(
        7,
        devices=[failed_device(1), device(0)],
        failures=["device_count_failed", "state_unwritable"],
        failure_summary="gpu1: write_failed",
        finished_wall=1_750_000_123.5,
    )
    summary = cycle_summary(message, devices=message.devices, age_s=0.0, received_at=10.0)
    assert summary.sequence == 7
    assert summary.enforced is False
    assert summary.failure_kinds == ("device_count_failed", "state_unwritable")
    assert summary.failure_summary == "gpu1: write_failed"
    assert summary.finished_wall == pytest.approx(1_750_000_123.5)
    assert [(g.index, g.outcome) for g in summary.gpus] == [(0, "enforced"), (1, "failed")]


def test_merged_replaces_by_index_and_keeps_the_rest() -> None:
    """A cycle's GPUs replace those with the same index; GPUs it did not reach keep their
    last report; new indexes are added; the table stays in index order."""
    table = (gpu(0), gpu(1), gpu(2))
    update = [gpu(1, outcome="failed", reason="write_failed"), gpu(5, outcome="idle")]
    result = merged(table, update)
    assert [g.index for g in result] == [0, 1, 2, 5]
    assert result[1].reason == "write_failed"
    assert result[0] is table[0]
    assert result[2] is table[2]
    assert merged(table, []) == table
    assert merged((), [gpu(3), gpu(1)]) == (gpu(1), gpu(3))


def test_a_gpu_reported_as_before_keeps_its_object_and_the_cycle_shares_it() -> None:
    """A cycle repeating the last one's GPU leaves the table's object in place (not a
    copy every 15 s), a changed GPU takes the new one, and the cycle's own GPUs are the
    table's objects where they are alike, its own where they differ."""
    table = gpu_summaries([device(0), device(1)])
    message = report(3, devices=[device(0), failed_device(1)])
    cycle = cycle_summary(message, devices=message.devices, age_s=0.0, received_at=1.0)
    fresh = cycle.gpus[0]
    assert fresh == table[0]
    assert fresh is not table[0]
    result = merged(table, [fresh, cycle.gpus[1]])
    assert result[0] is table[0]
    assert result[1] is cycle.gpus[1]
    shared = sharing(replace(cycle, gpus=(fresh, cycle.gpus[1])), result)
    assert shared.gpus[0] is table[0]
    assert shared.gpus[1] is cycle.gpus[1]
    assert sharing(cycle, (gpu(1, outcome="idle"),)).gpus[1] is cycle.gpus[1]


def test_device_faults_come_across_by_their_summaries_and_categories() -> None:
    """A GPU's active faults reach its summary as their stable summaries and categories,
    in the agent's order, with the device its slice names it as (what a DeviceTaintRule
    selects); its telemetry does not (it moves every cycle and would make every cycle an
    update to every cluster-stream subscriber), nor a healthy GPU's device name."""
    faulted = device(0)
    faulted.faults.add(kind=pb.FAULT_KIND_XID, summary="XID 79")
    faulted.faults.add(kind=pb.FAULT_KIND_GPU_LOST, summary="GPU lost")
    faulted.telemetry.power_draw_milliwatts = 250_000
    faulted.dra_driver_name, faulted.dra_pool_name = "gpu.nvidia.com", "node-a"
    faulted.dra_device_name = "gpu-0"
    (summary,) = gpu_summaries([faulted])
    assert summary.faults == ("XID 79", "GPU lost")
    assert summary.fault_kinds == ("xid", "gpu_lost")
    assert summary.dra_device == ("gpu.nvidia.com", "node-a", "gpu-0")
    healthy = device(0)
    healthy.dra_driver_name, healthy.dra_pool_name = "gpu.nvidia.com", "node-a"
    (plain,) = gpu_summaries([healthy])
    assert (plain.faults, plain.fault_kinds, plain.dra_device) == ((), (), None)
    assert summary == dataclasses.replace(
        plain,
        faults=("XID 79", "GPU lost"),
        fault_kinds=("xid", "gpu_lost"),
        dra_device=("gpu.nvidia.com", "node-a", "gpu-0"),
    )
