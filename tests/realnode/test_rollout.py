"""A rollout to an agent that cannot enforce stalls (seed 000: readiness gates the rollout).

A healthy release (sim backend, Ready by the kubelet's probe) is upgraded to
the NVML backend on a node whose driver fails every process list (the fake
NVML's fault), so the new agent runs, reconciles every cycle, and enforces
nothing. ``helm upgrade --wait`` does not report success; the DaemonSet's own
status says the rollout is incomplete and that its one unavailable pod is
the whole maxUnavailable budget: on a fleet, no other node's old agent would
be replaced. On this one-node cluster the old pod is the one maxUnavailable
lets go (maxSurge is 0).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.realnode.cluster import Cluster, ready, wait_for

NAMESPACE = "rollout"
RELEASE = "rollout"
BROKEN_DRIVER = [
    "devices 2",
    "fault nvmlDeviceGetComputeRunningProcesses * NVML_ERROR_UNKNOWN",
]


def daemonset(realnode: Cluster) -> dict[str, Any]:
    found: dict[str, Any] = realnode.node.plane.request(
        "GET", f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{RELEASE}-capwatch"
    )
    return found


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_upgrade_to_an_agent_that_cannot_enforce_does_not_complete(realnode: Cluster) -> None:
    """helm --wait fails, the new pod runs NotReady without restarting, and the
    DaemonSet reports one updated, unavailable pod: the rollout has stalled."""
    realnode.install(RELEASE, NAMESPACE, "--wait", "--timeout", "150s")
    try:
        old = realnode.agent_pod(NAMESPACE, RELEASE)
        assert old is not None
        assert ready(old) == "True"
        realnode.write_fakenvml(BROKEN_DRIVER)
        done = realnode.upgrade(
            RELEASE, NAMESPACE, "--set", "agent.gpuBackend=nvml", "--wait", "--timeout", "75s"
        )
        assert done.returncode != 0, "helm reported the rollout of a non-enforcing agent done"
        assert "context deadline exceeded" in done.stderr or "timed out" in done.stderr

        status = daemonset(realnode)["status"]
        assert status["observedGeneration"] == daemonset(realnode)["metadata"]["generation"]
        assert status["desiredNumberScheduled"] == 1
        assert status["updatedNumberScheduled"] == 1
        assert status.get("numberAvailable", 0) == 0
        assert status["numberUnavailable"] == 1  # the chart's maxUnavailable: all of it

        new = wait_for(lambda: realnode.agent_pod(NAMESPACE, RELEASE), 30.0, "the new pod")
        assert new["metadata"]["uid"] != old["metadata"]["uid"]
        assert ready(new) == "False"
        agent = next(c for c in new["status"]["containerStatuses"] if c["name"] == "agent")
        assert "running" in agent["state"]
        assert agent["restartCount"] == 0
    finally:
        realnode.write_fakenvml([])
        realnode.uninstall(RELEASE, NAMESPACE)
