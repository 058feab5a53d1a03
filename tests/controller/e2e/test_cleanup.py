"""``capwatch controller cleanup`` (the chart's post-delete hook) against the fake API
server: the condition goes from every Node that carries it, the release's
DeviceTaintRules go, and nothing else does."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from tests.controller.e2e.processes import CAPWATCH, ROOT
from tests.controller.e2e.support import CONDITION, NAMESPACE, Cluster

pytestmark = pytest.mark.slow

READY = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ready"}
OTHER = {"type": "FrequentKubeletRestart", "status": "False", "reason": "NoRestart"}


def _ours(status: str) -> dict[str, Any]:
    return {
        "type": CONDITION,
        "status": status,
        "reason": "CapsEnforced" if status == "True" else "AgentMissing",
        "message": "written by capwatch",
        "lastTransitionTime": "2025-03-01T10:00:00Z",
        "lastHeartbeatTime": "2025-03-01T10:00:00Z",
    }


def _cleanup(cluster: Cluster) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *CAPWATCH,
            *("controller", "cleanup", "--kubeconfig", str(cluster.kubeconfig)),
            *("--namespace", NAMESPACE, "--identity", "cleanup"),
        ],
        cwd=ROOT,
        env=cluster.processes.environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _types(cluster: Cluster, node: str) -> list[str]:
    found = cluster.fake.node(node)
    assert found is not None
    return [c["type"] for c in found["status"]["conditions"]]


def test_cleanup_removes_the_condition_and_only_it(cluster: Cluster) -> None:
    """Every Node carrying GPUPowerCapEnforced loses it, whether it is still a GPU node
    or no longer carries the GPU label; the other conditions stay, in order; a Node
    without it is not written at all. A removal answered 500 is tried again; one
    refused 403 is not: the run names it on a line of its own and exits 1, after the
    others were cleaned; a second run finishes the job."""
    cluster.gpu_node("gpu-1", conditions=[READY, _ours("True"), OTHER])
    cluster.gpu_node("gpu-2", conditions=[READY])
    cluster.fake.add_node("was-gpu", conditions=[_ours("Unknown"), READY])
    cluster.gpu_node("gpu-3", conditions=[_ours("Unknown")])
    cluster.fake.fail_next("node_status", 500)
    cluster.fake.fail_next("node_status", 403)

    first = _cleanup(cluster)
    assert first.returncode == 1, first.stdout + first.stderr
    lines = first.stdout.splitlines()
    assert lines[:3] == [
        f"removed {CONDITION} from 2 of 4 nodes",
        "removed 0 of 0 DeviceTaintRules",
        "capwatch controller cleanup: 1 left:",
    ], lines
    (failure,) = lines[3:]
    failed = failure.split()[1].rstrip(":")
    assert failure.startswith(f"  node {failed}: "), failure
    assert failed in {"gpu-1", "was-gpu", "gpu-3"}, failure
    assert "HTTP 403" in failure

    second = _cleanup(cluster)
    assert second.returncode == 0, second.stdout + second.stderr
    assert second.stdout.splitlines() == [
        f"removed {CONDITION} from 1 of 4 nodes",
        "removed 0 of 0 DeviceTaintRules",
    ]

    assert _types(cluster, "gpu-1") == ["Ready", "FrequentKubeletRestart"]
    assert _types(cluster, "gpu-2") == ["Ready"]
    assert _types(cluster, "was-gpu") == ["Ready"]
    assert _types(cluster, "gpu-3") == []
    written = [w.node for w in cluster.fake.node_status_writes()]  # those that succeeded
    assert sorted(written) == ["gpu-1", "gpu-3", "was-gpu"], written
    for write in cluster.fake.node_status_writes():
        assert write.patch == {"status": {"conditions": [{"type": CONDITION, "$patch": "delete"}]}}
        assert write.user_agent == "capwatch-controller/cleanup"


def _rule(name: str, instance: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": name,
            "labels": {
                "app.kubernetes.io/managed-by": "capwatch",
                "app.kubernetes.io/instance": instance,
            },
        },
        "spec": {
            "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "gpu-1", "device": "gpu-0"},
            "taint": {"key": "capwatch.io/gpu-fault", "value": "xid", "effect": "None"},
        },
    }


def test_cleanup_removes_the_releases_device_taint_rules_and_no_others(cluster: Cluster) -> None:
    """The rules labelled with this release (--release, the chart's release name) are
    deleted; another release's, and rules capwatch did not write, stay. A delete that
    is refused (403) exits 1 naming it; a second run finishes the job."""
    cluster.fake.put_taint_rule(_rule("capwatch-gpu-1-gpu-0-aaaa", "capwatch"))
    cluster.fake.put_taint_rule(_rule("capwatch-gpu-1-gpu-1-bbbb", "capwatch"))
    cluster.fake.put_taint_rule(_rule("other-gpu-1-gpu-0-cccc", "other"))
    theirs = _rule("an-admins-rule", "capwatch")
    theirs["metadata"]["labels"]["app.kubernetes.io/managed-by"] = "someone"
    cluster.fake.put_taint_rule(theirs)
    cluster.fake.fail_next("taint_rule", 403, method="DELETE")
    first = _cleanup(cluster)
    assert first.returncode == 1, first.stdout + first.stderr
    assert "removed 1 of 2 DeviceTaintRules" in first.stdout
    assert "  DeviceTaintRule capwatch-gpu-1-gpu-" in first.stdout
    second = _cleanup(cluster)
    assert second.returncode == 0, second.stdout + second.stderr
    assert second.stdout.splitlines()[-1] == "removed 1 of 1 DeviceTaintRules"
    assert sorted(cluster.fake.taint_rule_names()) == ["an-admins-rule", "other-gpu-1-gpu-0-cccc"]
