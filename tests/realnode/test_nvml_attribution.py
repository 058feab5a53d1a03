"""NVML inside the chart's agent container, and process -> pod attribution on real cgroups.

The fake libnvidia-ml.so.1 is mounted where the NVIDIA container toolkit puts
the real one, by the node's ``nvidia`` runtime class (values.yaml sets it), and
the chart's ``gpuBackend: nvml`` finds it with no other help. A workload pod
runs the pause binary under containerd and the kubelet; the fake NVML is told
that its container's process (host pid, as containerd reports it) runs on
GPU 0. The agent must map that pid to the pod through the cgroup paths
containerd and the kubelet really made, and cap GPU 0 to the pod's annotation:
the fake NVML's own write log is the evidence. Its socket, its emptyDir, its
state directory on the host and a runtime kill are exercised on the way.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from tests.realnode.cluster import Cluster, ready, status_writers, wait_for
from tests.realnode.containerd import FAKENVML_DIR

NAMESPACE = "nvml"
RELEASE = "nvml"
WORKLOAD_NS = "jobs"
WATTS = 250
SOCKET_GROUP = 2000


def writes_of(realnode: Cluster, milliwatts: int) -> list[dict[str, str]]:
    return [
        entry
        for entry in realnode.fakenvml_writes()
        if entry.get("device") == "0" and entry.get("milliwatts") == str(milliwatts)
    ]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_agent_caps_a_real_pods_gpu_found_through_its_cgroup(realnode: Cluster) -> None:
    """GPU 0 is capped to the workload's 250 W, written through the fake NVML in
    the agent's container; the stream names the pod; the ownership record is on
    the host; the socket carries the shim's stream; a container the runtime kills
    comes back, Ready again, and caps GPU 0 again."""
    trainer = realnode.run_workload(WORKLOAD_NS, "trainer", watts=WATTS)
    pid = realnode.container_pid(trainer, "main")
    realnode.write_fakenvml(
        ["devices 2", f"processes 0 {pid}", f"log_file {FAKENVML_DIR}/writes.log"]
    )
    realnode.install(RELEASE, NAMESPACE, "--set", "agent.gpuBackend=nvml")
    try:

        def ready_agent() -> dict[str, Any] | None:
            pod = realnode.agent_pod(NAMESPACE, RELEASE)
            return pod if pod is not None and ready(pod) == "True" else None

        agent = wait_for(ready_agent, 150.0, "the NVML agent Ready by the kubelet's probe")
        assert "kubelet" in status_writers(agent)
        wait_for(lambda: writes_of(realnode, WATTS * 1000), 60.0, "GPU 0 capped to 250 W")
        assert all(entry["rc"] == "0" for entry in writes_of(realnode, WATTS * 1000))

        snapshot = realnode.snapshot(agent)
        gpus = {device.index: device for device in snapshot.devices}
        assert set(gpus) == {0, 1}
        assert gpus[0].applied_watts == WATTS
        assert gpus[0].cap_source == pb.CAP_SOURCE_ANNOTATION
        assert [(o.namespace, o.name, o.uid) for o in gpus[0].owners] == [
            (WORKLOAD_NS, "trainer", trainer["metadata"]["uid"])
        ]
        assert gpus[1].reason == "idle"
        assert snapshot.readiness.ready

        # The host path the chart mounts: the record names the pod and the target.
        record = json.loads((realnode.node.state_dir(RELEASE) / "ownership.json").read_text())
        (entry,) = record["gpus"].values()
        assert entry["target_milliwatts"] == WATTS * 1000
        assert entry["owners"][0]["uid"] == trainer["metadata"]["uid"]

        # The socket in the pod's emptyDir: 0660, group-owned by the socket group the
        # shim runs in (fsGroup), so the non-root shim connects and the pod is Ready.
        socket = socket_path(realnode, agent)
        mode = socket.stat()
        assert stat.S_ISSOCK(mode.st_mode)
        assert stat.S_IMODE(mode.st_mode) == 0o660
        assert mode.st_gid == SOCKET_GROUP

        # Killed by the runtime (an OOM kill, a crash): restarted, Ready again, capping.
        before = len(writes_of(realnode, WATTS * 1000))
        realnode.kill_container(agent, "agent")

        def restarted_and_ready() -> dict[str, Any] | None:
            pod = realnode.agent_pod(NAMESPACE, RELEASE)
            if pod is None or ready(pod) != "True":
                return None
            counts = {c["name"]: c["restartCount"] for c in pod["status"]["containerStatuses"]}
            return pod if counts["agent"] >= 1 else None

        again = wait_for(restarted_and_ready, 180.0, "the killed agent back and Ready")
        assert again["metadata"]["uid"] == agent["metadata"]["uid"]
        wait_for(
            lambda: len(writes_of(realnode, WATTS * 1000)) > before, 60.0, "GPU 0 capped again"
        )
    finally:
        realnode.uninstall(RELEASE, NAMESPACE)
        realnode.write_fakenvml([])
        realnode.node.plane.request("DELETE", f"/api/v1/namespaces/{WORKLOAD_NS}/pods/trainer")


def socket_path(realnode: Cluster, pod: dict[str, Any]) -> Path:
    """The agent's socket as the kubelet laid out the pod's `sockets` emptyDir."""
    volumes = realnode.node.kubelet_paths.root_dir / "pods" / pod["metadata"]["uid"] / "volumes"
    return volumes / "kubernetes.io~empty-dir" / "sockets" / "agent.sock"
