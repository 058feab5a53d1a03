"""The claims tests' cluster on the real control plane, and what they read back.

One control plane per test module: kube-apiserver auditing every request, the real
kube-controller-manager (its resourceclaim controller), kube-scheduler (its DRA plugin)
and KWOK; a namespace and the chart's release per test; the pod as the scheduler binds
it; a GPU's status as the agent streams it; the agent's calls as the audit log has them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from tests.chart.support import Helm
from tests.controller.e2e.processes import wait_until
from tests.realkube.audit import AuditLog, audited_plane
from tests.realkube.components import Scene, open_scene, unique
from tests.realkube.controlplane import ControlPlane
from tests.realkube.dra import (
    AgentStream,
    ensure_device_class,
    get_claim,
    get_pod,
    pod_claim_names,
    reserved_for,
)
from tests.realkube.dra_node import DraNode
from tests.realkube.kwok_cluster import CONTROLLERS

NAMESPACED = ("--set", "rbac.namespaced=true")
SCHEDULED_S = 60.0  # a pod scheduled, its claim allocated, KWOK running it: a loaded machine
CONTROLLER_S = 60.0  # kube-controller-manager's deallocation or deletion
DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"


@pytest.fixture(scope="module")
def cluster(
    realkube_binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """The module's control plane (see the module docstring), with NVIDIA's DeviceClass."""
    with audited_plane(tmp_path_factory.mktemp("claims"), realkube_binaries) as plane:
        plane.start_controller_manager(controllers=CONTROLLERS, cluster_cidr=None)
        plane.start_scheduler()
        plane.start_kwok()
        ensure_device_class(plane)
        yield plane


@pytest.fixture
def audit(cluster: ControlPlane) -> AuditLog:
    return AuditLog(cluster.directory / "audit.log")


@contextmanager
def claims_scene(
    cluster: ControlPlane, helm: Helm, directory: Path, values: Sequence[str] = ()
) -> Iterator[Scene]:
    """A release of the chart in a namespace of the test's own, the agent's RBAC applied."""
    namespace = unique("claims").rstrip("-")
    cluster.create_namespace(namespace)
    try:
        with open_scene(
            cluster, namespace, helm, directory, components=("agent",), values=values
        ) as scene:
            yield scene
    finally:
        cluster.delete_namespace(namespace)


def scheduled(plane: ControlPlane, namespace: str, name: str, node: str) -> dict[str, Any]:
    """The pod once the scheduler bound it to ``node``, KWOK runs it, and every claim of it
    is allocated and reserved for it (read as admin)."""

    def ready() -> dict[str, Any] | None:
        pod = get_pod(plane, namespace, name)
        if pod is None or pod.get("status", {}).get("phase") != "Running":
            return None
        names = pod_claim_names(pod)
        if len(names) < len(pod["spec"]["resourceClaims"]):
            return None
        for claim_name in names.values():
            claim = get_claim(plane, namespace, claim_name)
            if claim is None or reserved_for(claim) != [pod["metadata"]["uid"]]:
                return None
        return pod

    pod = wait_until(ready, timeout=SCHEDULED_S, what=f"pod {name} scheduled and Running")
    assert pod is not None
    assert pod["spec"]["nodeName"] == node
    return pod


def claims_of(plane: ControlPlane, pod: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The pod's claims as the server holds them now, by the pod's entry name."""
    namespace = pod["metadata"]["namespace"]
    found = {}
    for entry, name in pod_claim_names(pod).items():
        claim = get_claim(plane, namespace, name)
        assert claim is not None, name
        found[entry] = claim
    return found


def status_of(stream: AgentStream, uuid: str, **expected: Any) -> pb.DeviceStatus:
    """Wait until the GPU's latest status on the stream has the ``expected`` fields."""

    def reached() -> pb.DeviceStatus | None:
        status = stream.latest(uuid)
        if status is None:
            return None
        return status if all(getattr(status, k) == v for k, v in expected.items()) else None

    status = wait_until(
        reached, timeout=30, what=f"{uuid} with {expected} (now {stream.latest(uuid)})"
    )
    assert status is not None
    return status


def claim_refs(status: pb.DeviceStatus) -> list[tuple[str, str]]:
    return [(c.namespace, c.name) for c in status.claims]


def assert_capped_from_idle(node: DraNode, stream: AgentStream, uuid: str, watts: int) -> None:
    """Every cycle before the first that capped the GPU found it idle (no safe default, no
    failure, no process: nothing in between), and the first write to it was the cap."""
    history = stream.of(uuid)
    first = next(i for i, (_, s) in enumerate(history) if s.outcome == pb.OUTCOME_ENFORCED)
    seen = [(seq, pb.Outcome.Name(s.outcome), s.applied_watts) for seq, s in history]
    assert first > 0, f"the stream began after the cap: nothing shows it came from idle {seen}"
    assert {s.outcome for _, s in history[:first]} == {pb.OUTCOME_IDLE}
    assert all(s.process_count == 0 for _, s in history)
    assert node.writes(uuid)[0] == watts * 1000


def assert_agent_allowed(audit: AuditLog, scene: Scene, mark: int) -> None:
    """The agent's calls since ``mark``: none refused, one LIST each of pods and slices in
    all (every cycle after that read the informers' memory: no request), and claims only
    read by name, never listed or watched."""
    calls = audit.calls(user=scene.release.user("agent"), since=mark)
    assert [str(c) for c in calls if c.code >= 400] == []
    lists = sorted(c.resource for c in calls if c.verb == "list")
    assert lists == ["pods", "resourceslices"], [str(c) for c in calls]
    assert {c.verb for c in calls if c.resource == "resourceclaims"} == {"get"}
