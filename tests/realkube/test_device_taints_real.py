"""DeviceTaintRules for faulted GPUs, on the real control plane (issue 28).

kube-apiserver (auditing), kube-controller-manager (its device-taint eviction
controller among the rest), kube-scheduler (its DRA plugin honours device taints),
KWOK nodes with NVIDIA's driver's ResourceSlice, a real agent on the fake NVML whose
XID event is queued before it starts (an XID 79 fault from its first cycles, cleared
``agent.faultRecoverySeconds`` after it), and the real controller as the chart runs it,
two replicas, each as its own pod's ServiceAccount token under the chart's RBAC,
following the agent by ``--targets``.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.chart.support import Helm
from tests.controller.e2e.processes import Process, wait_until
from tests.fakenvml.control import QueuedEvent
from tests.realkube.audit import AuditLog
from tests.realkube.claims_cluster import audit, cluster, scheduled
from tests.realkube.components import Scene, open_scene, unique
from tests.realkube.controlplane import ControlPlane
from tests.realkube.dra import (
    RESOURCE,
    PodClaim,
    allocated_devices,
    claim_spec,
    create_claim,
    create_claiming_pod,
    get_claim,
    get_pod,
)
from tests.realkube.dra_node import DraNode, NodeWithSlice, dra_node, start_dra_agent

__all__ = ["audit", "cluster"]  # the module's fixtures, from claims_cluster

pytestmark = [pytest.mark.slow, pytest.mark.nvml, pytest.mark.timeout(240)]

RULES = f"{RESOURCE}/devicetaintrules"
XID_FATAL = 79  # fell off the bus: no application causes it
RULE_WAIT_S = 30.0


@contextmanager
def taint_scene(
    cluster: ControlPlane, helm: Helm, directory: Path, values: Sequence[str]
) -> Iterator[Scene]:
    """A release with the agent's, the controller's and the cleanup hook's RBAC applied."""
    namespace = unique("taints").rstrip("-")
    cluster.create_namespace(namespace)
    try:
        with open_scene(
            cluster,
            namespace,
            helm,
            directory,
            components=("agent", "controller", "cleanup"),
            values=("--set", "controller.enabled=true", *values),
        ) as scene:
            yield scene
    finally:
        cluster.delete_namespace(namespace)


def controllers(scene: Scene, node: DraNode, count: int) -> list[Process]:
    """``count`` replicas of the one shard, following the node's agent by --targets."""
    targets = scene.directory / "targets"
    targets.write_text(f"{node.name} {node.address}\n", encoding="utf-8")
    return [scene.controller(i, f"--targets={targets}") for i in range(count)]


def rules(plane: ControlPlane, release: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/managed-by=capwatch,app.kubernetes.io/instance={release}"
    found: list[dict[str, Any]] = plane.request("GET", f"{RULES}?labelSelector={selector}")["items"]
    return found


def rule_for(plane: ControlPlane, release: str, device: str) -> dict[str, Any] | None:
    for rule in rules(plane, release):
        if rule["spec"]["deviceSelector"]["device"] == device:
            return rule
    return None


def writers(audit_log: AuditLog, since: int, user: str) -> set[str]:
    """The pods (by their tokens' pod-name) whose ``user`` wrote a DeviceTaintRule since
    ``since`` (kube-controller-manager's status updates are not ours)."""
    pods = set()
    with audit_log.path.open("rb") as log:
        log.seek(since)
        for line in log.read().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            ref = event.get("objectRef") or {}
            if ref.get("resource") != "devicetaintrules" or event["verb"] in ("list", "get"):
                continue
            if event.get("user", {}).get("username") != user:
                continue
            extra = event.get("user", {}).get("extra", {})
            pods.update(extra.get("authentication.kubernetes.io/pod-name", ["(no pod)"]))
    return pods


def faulted_on(made: NodeWithSlice, device: str) -> list[QueuedEvent]:
    return [QueuedEvent(index=made.nvml_index(device), data=XID_FATAL)]


def test_no_schedule_keeps_new_claims_off_a_faulted_gpu_until_it_recovers(
    cluster: ControlPlane, helm: Helm, tmp_path: Path, audit: AuditLog, fake_nvml_library: Path
) -> None:
    """XID 79 on gpu-0 with xid=NoSchedule: the leader writes one rule selecting exactly
    that device within a cycle and its write; a standby writes none. A pod whose claim
    could use either GPU gets gpu-1, never gpu-0; a second stays pending while gpu-0 is
    the only one left. The XID clears (fault recovery 12 s), the rule goes after the
    hold-down (3 s), and the pending pod gets gpu-0."""
    values = (
        "--set", "controller.deviceTaints.effects.xid=NoSchedule",
        "--set", "controller.deviceTaints.holdDownSeconds=3",
        "--set", "agent.faultRecoverySeconds=12",
    )  # fmt: skip
    mark = audit.mark()
    with taint_scene(cluster, helm, tmp_path, values) as scene:
        release, ns = scene.release.name, scene.namespace
        made = dra_node(scene)
        uuid0 = made.devices["gpu-0"]
        node = start_dra_agent(scene, made, events=faulted_on(made, "gpu-0"))
        replicas = controllers(scene, node, 2)
        with node.stream() as stream:
            faulted = wait_until(
                lambda: next(
                    (
                        c.sequence
                        for c in stream.history()
                        if uuid0 in c.devices and c.devices[uuid0].faults
                    ),
                    None,
                ),
                timeout=RULE_WAIT_S,
                what="the agent reporting the XID",
            )
            seen_at = time.monotonic()
            rule = wait_until(
                lambda: rule_for(cluster, release, "gpu-0"), timeout=RULE_WAIT_S, what="the rule"
            )
            took = time.monotonic() - seen_at
        assert faulted is not None
        assert rule["spec"]["deviceSelector"] == {
            "driver": "gpu.nvidia.com",
            "pool": node.name,
            "device": "gpu-0",
        }
        assert rule["spec"]["taint"]["key"] == "capwatch.io/gpu-fault"
        assert (rule["spec"]["taint"]["value"], rule["spec"]["taint"]["effect"]) == (
            "xid",
            "NoSchedule",
        )
        assert "XID 79" in rule["metadata"]["annotations"]["capwatch.io/message"]
        assert took < 10.0, f"the rule came {took:.1f}s after the faulted cycle reached us"
        assert len(rules(cluster, release)) == 1

        create_claim(cluster, ns, "first", claim_spec(["gpu"], []))
        create_claiming_pod(cluster, ns, "first", node.name, [PodClaim("gpu", claim="first")])
        pod = scheduled(cluster, ns, "first", node.name)
        claim = get_claim(cluster, ns, "first")
        assert claim is not None
        assert allocated_devices(claim)["gpu"][2] == "gpu-1", pod["metadata"]["name"]

        create_claim(cluster, ns, "second", claim_spec(["gpu"], []))
        create_claiming_pod(cluster, ns, "second", node.name, [PodClaim("gpu", claim="second")])
        time.sleep(4)  # the scheduler has tried (and retries): only the tainted GPU is left
        waiting = get_pod(cluster, ns, "second")
        assert waiting is not None
        assert "nodeName" not in waiting["spec"]
        second = get_claim(cluster, ns, "second")
        assert second is not None
        assert not second.get("status", {}).get("allocation")

        # Recovery: the XID's quiet window, then the hold-down; the pod gets gpu-0.
        wait_until(
            lambda: rule_for(cluster, release, "gpu-0") is None,
            timeout=12 + 3 + RULE_WAIT_S,
            what="the rule removed after recovery and hold-down",
        )
        scheduled(cluster, ns, "second", node.name)
        after = get_claim(cluster, ns, "second")
        assert after is not None
        assert allocated_devices(after)["gpu"][2] == "gpu-0"
        assert all(replica.popen.poll() is None for replica in replicas)
    written = writers(audit, mark, scene.release.user("controller"))
    assert len(written) == 1, written  # the leader alone, whichever it was
    assert next(iter(written)).startswith(f"{release}-controller-")


def test_no_execute_evicts_the_pod_on_the_faulted_gpu_and_uninstall_removes_the_rule(
    cluster: ControlPlane, helm: Helm, tmp_path: Path, fake_nvml_library: Path
) -> None:
    """A pod runs with gpu-X allocated; the agent then reports XID 79 on it, xid=NoExecute:
    Kubernetes' own device-taint eviction controller evicts the pod. The chart's cleanup
    hook leaves no rule of the release behind."""
    values = ("--set", "controller.deviceTaints.effects.xid=NoExecute")
    with taint_scene(cluster, helm, tmp_path, values) as scene:
        release, ns = scene.release.name, scene.namespace
        made = dra_node(scene)
        create_claim(cluster, ns, "job", claim_spec(["gpu"], []))
        create_claiming_pod(cluster, ns, "job", made.name, [PodClaim("gpu", claim="job")])
        pod = scheduled(cluster, ns, "job", made.name)
        claim = get_claim(cluster, ns, "job")
        assert claim is not None
        device = allocated_devices(claim)["gpu"][2]
        node = start_dra_agent(scene, made, events=faulted_on(made, device))
        (leader,) = controllers(scene, node, 1)
        rule = wait_until(
            lambda: rule_for(cluster, release, device), timeout=RULE_WAIT_S, what="the rule"
        )
        assert rule["spec"]["taint"]["effect"] == "NoExecute"

        def evicted() -> bool:
            now = get_pod(cluster, ns, "job")
            return (
                now is None
                or now["metadata"]["uid"] != pod["metadata"]["uid"]
                or bool(now["metadata"].get("deletionTimestamp"))
            )

        wait_until(evicted, timeout=60, what="the pod evicted by the eviction controller")
        leader.signal(signal.SIGTERM)
        assert leader.wait(timeout=30) == 0, leader.log[-2000:]
        done = scene.cleanup()
        assert done.returncode == 0, done.stdout + done.stderr
        assert "removed 1 of 1 DeviceTaintRules" in done.stdout
        assert rules(cluster, release) == []
