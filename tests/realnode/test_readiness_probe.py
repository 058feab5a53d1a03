"""The kubelet's own readiness probe of /readyz, on the chart's unchanged pod.

Installed with DIR/values.yaml (the sim backend and the chart's 15 s interval),
the agent runs the built-in scenario: cycles 1-3 enforce, cycles 4-6 fail
(the driver refuses GPU 0's write), cycle 7 recovers. Three failing probes 10 s
apart turn the pod's Ready condition False, and the next good cycle's probe
turns it True: as the kubelet writes them (the pod status's manager is the
kubelet), with the agent never restarted (readiness restarts nothing).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.realnode.cluster import Cluster, ready, status_writers, wait_for

NAMESPACE = "probe"
RELEASE = "probe"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_kubelets_probe_turns_the_pod_ready_not_ready_and_ready(realnode: Cluster) -> None:
    """Ready after the first good cycles, NotReady through the scenario's failing
    cycles, Ready again after its recovery: every transition the kubelet's."""
    realnode.install(RELEASE, NAMESPACE)
    try:

        def agent() -> dict[str, Any] | None:
            return realnode.agent_pod(NAMESPACE, RELEASE)

        def with_ready(status: str) -> dict[str, Any] | None:
            pod = agent()
            return pod if pod is not None and ready(pod) == status else None

        first = wait_for(lambda: with_ready("True"), 150.0, "the agent pod Ready")
        # The failing phase starts with cycle 4 (about 45 s in) and lasts three cycles.
        down = wait_for(lambda: with_ready("False"), 150.0, "NotReady in the failing cycles")
        back = wait_for(lambda: with_ready("True"), 150.0, "Ready again after recovery")
        for pod in (first, down, back):
            assert pod["metadata"]["uid"] == first["metadata"]["uid"]
            assert "kubelet" in status_writers(pod)
        restarts = {
            status["name"]: status["restartCount"] for status in back["status"]["containerStatuses"]
        }
        assert restarts == {"agent": 0, "readyz": 0}
    finally:
        realnode.uninstall(RELEASE, NAMESPACE)
