"""A real ``capwatch agent`` on the fake libnvidia-ml, as the chart's DaemonSet pod would
run it, against the real API server as the agent's ServiceAccount.

:func:`start_agent` makes the node's agent pod (the token is bound to it, as the
kubelet's projected token is), one workload pod asking for a cap by the chart's
annotation key, the workload's process in a fake /proc (so attribution finds it) and
on the fake GPU, and starts the agent. With ``claim=True`` the node is also a Node the
scheduler can place pods on, with a second GPU in its GPU driver's ResourceSlice
(tests/realkube/dra.py), and a pod whose ResourceClaim asks ``CLAIM_W`` of it with
capwatch's config: the real kube-scheduler (which the server must run) allocates the
claim and binds the pod; no process runs on that GPU. :class:`AgentRun` reads back what
it did: the NVML writes, the cycles it logged, the Events on the workload pod.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capwatch.agent.sim.proctree import ProcSpec, materialise
from tests.controller.e2e.processes import Process
from tests.fakenvml.control import FakeConfig, FakeDevice, read_log_file
from tests.realkube.access import BoundPod
from tests.realkube.components import Scene
from tests.realkube.dra import (
    PodClaim,
    cap_config,
    claim_spec,
    create_claim,
    create_claiming_pod,
    ensure_device_class,
    power_cap,
    publish_slice,
    schedulable_node,
)
from tests.realkube.local import flag

GPU_UUID = "GPU-ab500000-0000-4000-8000-000000000000"
CLAIM_GPU_UUID = "GPU-ab500000-0000-4000-8000-000000000001"
PID = 4101
CAP_W = 250
CLAIM_W = 350


@dataclass(kw_only=True)
class AgentRun:
    """One agent process and what it was given to cap."""

    scene: Scene
    node: str
    workload: dict[str, Any]  # the pod asking for CAP_W
    process: Process
    log_file: Path  # the fake NVML's write log

    @property
    def workload_name(self) -> str:
        return str(self.workload["metadata"]["name"])

    def writes(self, uuid: str = GPU_UUID) -> list[int]:
        """The milliwatts of every successful cap write to the GPU ``uuid``, in order."""
        if not self.log_file.exists():
            return []
        return [e.milliwatts for e in read_log_file(self.log_file) if e.rc == 0 and e.uuid == uuid]

    def claim_writes(self) -> list[int]:
        """The same, of the GPU the claim holds (``claim=True``)."""
        return self.writes(CLAIM_GPU_UUID)

    def cycles(self) -> list[str]:
        """The agent's cycle log lines (``cycle seq=N enforced=...``)."""
        return [
            line for line in self.process.log.splitlines() if re.search(r"cycle seq=\d+ ", line)
        ]

    def enforced_cycles(self) -> int:
        return sum("enforced=true" in line for line in self.cycles())

    def events(self) -> list[dict[str, Any]]:
        """The Events on the workload pod, as `kubectl describe pod` finds them."""
        metadata = self.workload["metadata"]
        selector = (
            f"involvedObject.kind=Pod,involvedObject.name={metadata['name']},"
            f"involvedObject.namespace={metadata['namespace']},involvedObject.uid={metadata['uid']}"
        )
        path = f"/api/v1/namespaces/{metadata['namespace']}/events?fieldSelector={selector}"
        items: list[dict[str, Any]] = self.scene.plane.request("GET", path)["items"]
        return items

    def annotate(self, watts: int) -> None:
        """Ask for another cap, as a user's `kubectl annotate --overwrite` does."""
        metadata = self.workload["metadata"]
        path = f"/api/v1/namespaces/{metadata['namespace']}/pods/{metadata['name']}"
        current = self.scene.plane.request("GET", path)
        current["metadata"]["annotations"][annotation_key(self.scene)] = str(watts)
        self.workload = self.scene.plane.request("PUT", path, current)


def annotation_key(scene: Scene) -> str:
    return flag(scene.release.container("DaemonSet", "agent")["args"], "--annotation-key")


def start_agent(
    scene: Scene, *, silence_bound_s: float = 5.0, claim: bool = False, owned: bool = False
) -> AgentRun:
    """The agent of a node of its own (no other test's pods on it), capping one workload
    (and with ``claim``, one claimed GPU with no process: see the module docstring).
    ``owned``: its pod is controlled by the release's DaemonSet, so at SIGTERM the agent
    reads the pod, the DaemonSet and the node (the node is not one the DaemonSet selects:
    it leaves, and restores the defaults). Only where no kube-controller-manager runs:
    its DaemonSet controller would delete a pod on a node the DaemonSet does not select."""
    node = f"node-{uuid.uuid4().hex[:8]}"
    tag = uuid.uuid4().hex[:6]
    directory = scene.directory / f"agent-{tag}"
    directory.mkdir()
    devices = [FakeDevice(uuid=GPU_UUID, pids=(PID,))]
    if claim:
        _claimed_gpu(scene, node, tag)
        devices.append(FakeDevice(uuid=CLAIM_GPU_UUID))
    own = scene.agent_pod(node, scene.loopback.ip(9), owned=owned)
    workload = scene.pod(f"trainer-{tag}", node, annotations={annotation_key(scene): str(CAP_W)})
    materialise(directory / "proc", [ProcSpec(pid=PID, pod_uid=workload["metadata"]["uid"])])
    log_file = directory / "nvml-writes.log"
    config = FakeConfig(devices=tuple(devices), log_file=log_file).write(
        directory / "fake-nvml.conf"
    )
    kubeconfig = scene.kubeconfig(
        "agent", pod=BoundPod(own["metadata"]["name"], own["metadata"]["uid"])
    )
    process = scene.agent(
        own,
        kubeconfig=kubeconfig,
        nvml_config=config,
        proc_root=directory / "proc",
        silence_bound_s=silence_bound_s,
    )
    return AgentRun(scene=scene, node=node, workload=workload, process=process, log_file=log_file)


def _claimed_gpu(scene: Scene, node: str, tag: str) -> None:
    """``node`` as a Node the scheduler places pods on, its slice naming CLAIM_GPU_UUID
    ``gpu-0``, and a pod whose claim asks CLAIM_W of a GPU there (for the scheduler)."""
    plane, namespace = scene.plane, scene.namespace
    made = schedulable_node(plane, node)
    scene.nodes.append(node)
    scene.paths.append(publish_slice(plane, made, {"gpu-0": CLAIM_GPU_UUID}))
    ensure_device_class(plane)
    spec = claim_spec(["gpu"], [cap_config(power_cap(CLAIM_W))])
    create_claim(plane, namespace, f"capped-{tag}", spec)
    create_claiming_pod(
        plane, namespace, f"claimer-{tag}", node, [PodClaim("gpu", claim=f"capped-{tag}")]
    )
