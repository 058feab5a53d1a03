"""The controller's summaries to capwatch.v1 cluster messages (controller/cluster/mapping.py)."""

from __future__ import annotations

import dataclasses

import pytest

from capwatch.api.gen.capwatch.v1 import cluster_health_pb2 as cpb
from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.controller.cluster.mapping import gpu
from capwatch.controller.conditions import GpuSummary

BASE = GpuSummary(
    index=2, uuid="GPU-2", healthy=True, outcome="enforced", reason="ok", message="capped"
)


@pytest.mark.parametrize(
    ("summary", "expected"),
    [
        (
            BASE,
            cpb.GpuSummary(
                index=2,
                uuid="GPU-2",
                health=pb.DEVICE_HEALTH_HEALTHY,
                outcome=pb.OUTCOME_ENFORCED,
                reason="ok",
                message="capped",
            ),
        ),
        (
            dataclasses.replace(BASE, applied_watts=0, healthy=None),
            cpb.GpuSummary(
                index=2,
                uuid="GPU-2",
                health=pb.DEVICE_HEALTH_UNKNOWN,
                outcome=pb.OUTCOME_ENFORCED,
                reason="ok",
                message="capped",
                applied_watts=0,
            ),
        ),
        (
            dataclasses.replace(BASE, healthy=False, faults=("XID 79", "GPU lost")),
            cpb.GpuSummary(
                index=2,
                uuid="GPU-2",
                health=pb.DEVICE_HEALTH_UNHEALTHY,
                outcome=pb.OUTCOME_ENFORCED,
                reason="ok",
                message="capped",
                faults=["XID 79", "GPU lost"],
            ),
        ),
    ],
    ids=["healthy", "zero-watts-unknown-health", "faulted"],
)
def test_gpu_summary_message(summary: GpuSummary, expected: cpb.GpuSummary) -> None:
    """Health, outcome, an applied 0 W (a value, not absence) and device faults map as shown."""
    assert gpu(summary) == expected
