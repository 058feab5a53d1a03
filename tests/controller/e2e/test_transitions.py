"""Every class of transition, end to end: real agents on simulated GPUs, a real
``capwatch controller`` discovering them by their pods in the fake API server, and the
Node condition and Events it writes there."""

from __future__ import annotations

import signal

import pytest

from tests.controller.e2e.processes import Process, wait_until
from tests.controller.e2e.support import Cluster, fencing_violations

pytestmark = pytest.mark.slow


def _start(cluster: Cluster, *agents: tuple[str, int]) -> Process:
    """Each agent serving with its pod, then the controller, leading: it dials every
    agent once it is up (an agent still starting would read AgentUnreachable first)."""
    for node, n in agents:
        cluster.pod(node, n)
        cluster.wait_cycled(node)
    controller = cluster.controller("c1")
    cluster.wait_leader("c1")
    return controller


def test_a_cap_write_failure_reads_false_then_true_again(cluster: Cluster) -> None:
    """A GPU whose cap write the driver refuses for three cycles turns the node's
    condition False with reason CapWriteFailed and a message naming that GPU (one
    Warning Event), and its recovery turns it True again (one Normal Event); the first
    True has no Event. Only transitions are written (three applies over ~25 cycles), the
    kubelet's Ready condition is left alone, lastTransitionTime moves with the status.
    (The node is followed for its agent pod, not by a GPU label, and the controller is
    up before the agent starts: the failing cycles, 7 s into the agent's life, come
    after the controller follows it however slowly a loaded machine starts processes.)"""
    cluster.fake.add_node("gpu-a")
    cluster.controller("c1")
    cluster.wait_leader("c1")
    cluster.agent("gpu-a", 1, fail_cycles=(14, 16))
    cluster.wait_cycled("gpu-a")
    cluster.pod("gpu-a", 1)

    first = cluster.wait_condition("gpu-a", "True", "CapsEnforced")
    assert first["message"] == "power caps enforced; 1 of 2 GPUs capped"
    failed = cluster.wait_condition("gpu-a", "False", "CapWriteFailed")
    assert failed["message"].startswith(
        "gpu0 (GPU-e2e00000-0000-4000-8000-000000000000): write_failed:"
    ), failed["message"]
    assert "no_permission" in failed["message"]
    recovered = cluster.wait_condition("gpu-a", "True", "CapsEnforced")

    assert cluster.writes("gpu-a") == [
        ("True", "CapsEnforced"),
        ("False", "CapWriteFailed"),
        ("True", "CapsEnforced"),
    ]
    cluster.wait_events("gpu-a", [("Warning", "CapWriteFailed"), ("Normal", "CapsEnforced")])
    node = cluster.fake.node("gpu-a")
    assert node is not None
    # The real API server's apply puts a new condition last; the fake does too.
    assert [c["type"] for c in node["status"]["conditions"]] == ["Ready", "GPUPowerCapEnforced"]
    assert first["lastTransitionTime"] < failed["lastTransitionTime"]
    assert failed["lastTransitionTime"] < recovered["lastTransitionTime"]
    assert all(w.user_agent == "capwatch-controller/c1" for w in cluster.fake.node_status_writes())
    assert fencing_violations(cluster.fake) == []


def test_a_killed_agent_reads_unreachable_and_a_deleted_pod_missing(cluster: Cluster) -> None:
    """SIGKILL of a node's agent turns its condition Unknown/AgentUnreachable naming the
    agent's address (Warning Event); deleting its pod then turns it AgentMissing. A GPU
    node that never had an agent pod reads AgentMissing from the start; a node without
    the GPU label is never written."""
    cluster.gpu_node("gpu-b")
    cluster.gpu_node("gpu-d")
    cluster.fake.add_node("cpu-0")
    cluster.agent("gpu-b", 1)
    _start(cluster, ("gpu-b", 1))

    missing = cluster.wait_condition("gpu-d", "Unknown", "AgentMissing")
    assert missing["message"] == "no capwatch agent is running on this node"
    cluster.wait_condition("gpu-b", "True", "CapsEnforced")

    cluster.agents["gpu-b"].popen.kill()
    lost = cluster.wait_condition("gpu-b", "Unknown", "AgentUnreachable")
    assert lost["message"].startswith(
        f"the capwatch agent at {cluster.loopback.address(1)} is unreachable: UNAVAILABLE"
    ), lost["message"]
    cluster.fake.delete_pod("capwatch", "capwatch-agent-gpu-b")
    cluster.wait_condition("gpu-b", "Unknown", "AgentMissing")

    assert cluster.writes("gpu-b") == [
        ("True", "CapsEnforced"),
        ("Unknown", "AgentUnreachable"),
        ("Unknown", "AgentMissing"),
    ]
    cluster.wait_events(
        "gpu-b",
        [
            ("Warning", "AgentUnreachable"),
            ("Warning", "AgentMissing"),
        ],
    )
    assert cluster.writes("gpu-d") == [("Unknown", "AgentMissing")]
    cluster.wait_events("gpu-d", [("Warning", "AgentMissing")])
    assert cluster.fake.node_status_writes("cpu-0") == []
    assert fencing_violations(cluster.fake) == []


def test_an_agent_answering_for_another_node_is_refused(cluster: Cluster) -> None:
    """Two pods on one pod IP (a recycled address): the agent there serves gpu-a, so the
    controller's stream for gpu-e is refused with FAILED_PRECONDITION. gpu-e reads
    Unknown/AgentUnreachable naming the refusal, and nothing of gpu-a's health is ever
    written to gpu-e, in its condition or on the cluster stream; gpu-a itself reads True."""
    cluster.gpu_node("gpu-a")
    cluster.gpu_node("gpu-e")
    cluster.agent("gpu-a", 1)
    cluster.pod("gpu-e", 1)
    controller = _start(cluster, ("gpu-a", 1))

    cluster.wait_condition("gpu-a", "True", "CapsEnforced")
    refused = cluster.wait_condition("gpu-e", "Unknown", "AgentUnreachable")
    assert "refused: FAILED_PRECONDITION" in refused["message"], refused["message"]
    assert "this agent serves node 'gpu-a', not 'gpu-e'" in refused["message"]
    # The refusal is retried with backoff, and refused again: still nothing but that.
    wait_until(
        lambda: controller.log.count("this agent serves node 'gpu-a', not 'gpu-e'") >= 3,
        what="the controller to retry the refused stream",
    )
    assert cluster.writes("gpu-e") == [("Unknown", "AgentUnreachable")]
    cluster.wait_events("gpu-e", [("Warning", "AgentUnreachable")])
    assert cluster.writes("gpu-a") == [("True", "CapsEnforced")]
    assert "refusing a misdirected stream" not in controller.log  # refused by the agent
    assert fencing_violations(cluster.fake) == []


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
    cluster.wait_cycled("gpu-a")
    cluster.fake.hang_next_lists(3.0)
    controller = cluster.controller("c1")
    cluster.wait_leader("c1")
    controller.wait_log(r"listed what='GPU nodes'")

    cluster.wait_condition("gpu-a", "True", "CapsEnforced")
    assert cluster.writes("gpu-a") == [("True", "CapsEnforced")]
    assert cluster.events("gpu-a") == []


def test_a_hung_agent_reads_stale_then_unreachable_then_true(cluster: Cluster) -> None:
    """An agent that stops (SIGSTOP: its connection stays open, nothing is sent) reads
    Unknown/CycleStale once its last cycle is older than its staleness bound (3 intervals),
    without waiting for a message, then AgentUnreachable when the stream's silence
    timeout gives up on it; once it runs again (SIGCONT) the node reads True."""
    cluster.gpu_node("gpu-h")
    agent = cluster.agent("gpu-h", 1)
    _start(cluster, ("gpu-h", 1))
    cluster.wait_condition("gpu-h", "True", "CapsEnforced")

    agent.signal(signal.SIGSTOP)
    try:
        stale = cluster.wait_condition("gpu-h", "Unknown", "CycleStale")
        assert "within its staleness bound (1.5s)" in stale["message"], stale["message"]
        cluster.wait_condition("gpu-h", "Unknown", "AgentUnreachable")
    finally:
        agent.signal(signal.SIGCONT)
    cluster.wait_condition("gpu-h", "True", "CapsEnforced", timeout=30)
    assert cluster.writes("gpu-h") == [
        ("True", "CapsEnforced"),
        ("Unknown", "CycleStale"),
        ("Unknown", "AgentUnreachable"),
        ("True", "CapsEnforced"),
    ]
    cluster.wait_events(
        "gpu-h",
        [("Warning", "CycleStale"), ("Warning", "AgentUnreachable"), ("Normal", "CapsEnforced")],
    )


def test_an_unchanged_condition_is_rewritten_only_as_a_heartbeat(cluster: Cluster) -> None:
    """With --condition-heartbeat 1 an unchanged True is rewritten about once a second:
    each rewrite moves lastHeartbeatTime, keeps lastTransitionTime, and posts no Event."""
    cluster.gpu_node("gpu-a")
    cluster.agent("gpu-a", 1)
    cluster.pod("gpu-a", 1)
    cluster.wait_cycled("gpu-a")
    cluster.controller("c1", "--condition-heartbeat", "1")
    first = cluster.wait_condition("gpu-a", "True", "CapsEnforced")
    wait_until(lambda: len(cluster.writes("gpu-a")) >= 3, what="two heartbeats")

    assert set(cluster.writes("gpu-a")) == {("True", "CapsEnforced")}
    patches = [w.patch["status"]["conditions"][0] for w in cluster.fake.node_status_writes("gpu-a")]
    beats = [p["lastHeartbeatTime"] for p in patches]
    assert beats == sorted(set(beats)), beats  # each later than the one before
    assert {p["lastTransitionTime"] for p in patches} == {first["lastTransitionTime"]}
    assert cluster.events("gpu-a") == []
