"""Every class of transition, end to end: real agents on simulated GPUs, a real
``capwatch controller`` discovering them by their pods in the fake API server, and the
Node condition and Events it writes there."""

from __future__ import annotations

import pytest

from tests.controller.e2e.support import Cluster

pytestmark = pytest.mark.slow


def test_a_start_that_lists_nodes_before_agent_pods_writes_no_transient_missing(
    cluster: Cluster,
) -> None:
    """A controller (re)starting over a healthy cluster, whose GPU-node list is answered
    before its agent-pod list (here the pod list is held 3 s), does not take the GPU
    nodes for agent-less: it writes no transient Unknown/AgentMissing (and posts no
    Warning) to a node whose agent is running, only its True once it has heard it."""
    cluster.gpu_node("gpu-a")
    cluster.agent("gpu-a", 1)
    cluster.pod("gpu-a", 1)
    cluster.agents["gpu-a"].wait_log(r"grpc serving addresses=")
    cluster.fake.hang_next_lists(3.0)
    controller = cluster.controller("c1")
    cluster.wait_leader("c1")
    controller.wait_log(r"listed what='GPU nodes'")

    cluster.wait_condition("gpu-a", "True", "CapsEnforced")
    assert cluster.writes("gpu-a") == [("True", "CapsEnforced")]
    assert cluster.events("gpu-a") == []
