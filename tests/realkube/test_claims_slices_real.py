"""Claims in their corners on the real control plane (issue 27): the node's ResourceSlice
deleted and republished under a new generation while a claimed GPU is capped, and the
cluster's ceiling on a claim's cap and on an annotation's.

The cluster is claims_cluster's (the real kube-apiserver, kube-controller-manager,
kube-scheduler and KWOK); the agent is a real ``capwatch agent`` on the fake NVML with
the chart's rendered args, as the chart's ServiceAccount under the chart's RBAC (claims:
``get`` only).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from tests.chart.support import Helm
from tests.controller.e2e.processes import wait_until
from tests.realkube.agentrun import CAP_W, start_agent
from tests.realkube.audit import AuditLog
from tests.realkube.claims_cluster import (
    assert_agent_allowed,
    audit,
    claims_of,
    claims_scene,
    cluster,
    scheduled,
    status_of,
)
from tests.realkube.controlplane import ControlPlane
from tests.realkube.dra import (
    RESOURCE,
    AgentStream,
    PodClaim,
    allocated_devices,
    cap_config,
    claim_spec,
    create_claim,
    create_claiming_pod,
    power_cap,
    resource_slice,
)
from tests.realkube.dra_node import DEFAULT_MW, DraNode, start_dra_node

__all__ = ["audit", "cluster"]  # the module's fixtures, from claims_cluster

pytestmark = [pytest.mark.slow, pytest.mark.nvml, pytest.mark.timeout(180)]

CYCLE_S = 30.0


def node_slices(plane: ControlPlane, node: str) -> list[dict[str, Any]]:
    listed = plane.request("GET", f"{RESOURCE}/resourceslices?fieldSelector=spec.nodeName={node}")
    return list(listed["items"])


def republish(plane: ControlPlane, node: DraNode, devices: dict[str, str], generation: int) -> None:
    """The driver's restart: its slice of the node written again under a new generation."""
    made = plane.request("GET", f"/api/v1/nodes/{node.name}")
    item = resource_slice(made, devices)
    item["spec"]["pool"]["generation"] = generation
    plane.request("POST", f"{RESOURCE}/resourceslices", item)


def failure(stream: AgentStream, kind: str) -> str:
    """The message of a failure of ``kind`` in the latest cycle that has one."""

    def found() -> str | None:
        for cycle in reversed(stream.history()):
            for text in cycle.failures:
                if text.startswith(f"{kind}: "):
                    return text.removeprefix(f"{kind}: ")
        return None

    message = wait_until(found, timeout=CYCLE_S, what=f"a cycle failing with {kind}")
    assert message is not None
    return message


def test_a_deleted_or_remapped_slice_never_moves_or_drops_a_claims_cap(
    cluster: ControlPlane, helm: Helm, tmp_path: Path, audit: AuditLog, fake_nvml_library: Path
) -> None:
    """A claim capped at 450 W; the node's slice is then deleted (a driver restart): the
    GPU keeps its cap (no default written), the cycle fails naming the claim, the device
    and the GPU the cap stays on. The driver republishes under generation 2 with the two
    GPUs' names swapped: the cap stays on the GPU the workload was prepared on, the other
    GPU is never written, the move is named. The pod deleted, the GPU is released."""
    mark = audit.mark()
    with claims_scene(cluster, helm, tmp_path) as scene:
        ns = scene.namespace
        node = start_dra_node(scene)
        with node.stream() as stream:
            create_claim(cluster, ns, "gpu-450w", claim_spec(["gpu"], [cap_config(power_cap(450))]))
            create_claiming_pod(cluster, ns, "job", node.name, [PodClaim("gpu", claim="gpu-450w")])
            pod = scheduled(cluster, ns, "job", node.name)
            device = allocated_devices(claims_of(cluster, pod)["gpu"])["gpu"]
            uuid = node.device_of(device)
            (other,) = set(node.devices.values()) - {uuid}
            status_of(stream, uuid, outcome=pb.OUTCOME_ENFORCED, applied_watts=450)

            for item in node_slices(cluster, node.name):
                name = item["metadata"]["name"]
                cluster.request("DELETE", f"{RESOURCE}/resourceslices/{name}")
            unmapped = failure(stream, "claim_device_unmapped")
            assert unmapped == (
                f"claim {ns}/gpu-450w: device gpu.nvidia.com/{node.name}/{device[2]}: no "
                f"ResourceSlice of this node lists pool gpu.nvidia.com/{node.name}; its cap "
                f"stays on {uuid}"
            )
            kept = status_of(stream, uuid, outcome=pb.OUTCOME_ENFORCED)
            assert kept.applied_watts == 450
            assert DEFAULT_MW not in node.writes(uuid)

            swapped = dict(zip(node.devices, reversed(node.devices.values()), strict=True))
            republish(cluster, node, swapped, generation=2)
            moved = failure(stream, "claim_device_moved")
            assert moved.endswith(
                f"this node's slices now name {other} for it; it was prepared on {uuid}; "
                f"its cap stays on {uuid}"
            )
            time.sleep(2)  # a few more cycles: the other GPU must stay untouched
            assert stream.latest(other).outcome == pb.OUTCOME_IDLE  # type: ignore[union-attr]
            assert node.writes(other) == []
            assert stream.latest(uuid).applied_watts == 450  # type: ignore[union-attr]

            cluster.request("DELETE", f"/api/v1/namespaces/{ns}/pods/job")
            status_of(stream, uuid, outcome=pb.OUTCOME_RELEASED)
            assert node.writes(uuid)[-1] == DEFAULT_MW
    assert_agent_allowed(audit, scene, mark)


def test_the_clusters_ceiling_clamps_a_claims_cap(
    cluster: ControlPlane, helm: Helm, tmp_path: Path, audit: AuditLog, fake_nvml_library: Path
) -> None:
    """agent.caps.ceilingWatts 400: a claim asking 450 W gets 400 W, the stream says the
    cap was lowered to the cluster's ceiling, and the claim's pod gets a PowerCapClamped
    Event saying so."""
    values = ("--set", "agent.caps.ceilingWatts=400")
    with claims_scene(cluster, helm, tmp_path, values) as scene:
        ns = scene.namespace
        node = start_dra_node(scene)
        with node.stream() as stream:
            create_claim(cluster, ns, "greedy", claim_spec(["gpu"], [cap_config(power_cap(450))]))
            create_claiming_pod(cluster, ns, "job", node.name, [PodClaim("gpu", claim="greedy")])
            pod = scheduled(cluster, ns, "job", node.name)
            uuid = node.device_of(allocated_devices(claims_of(cluster, pod)["gpu"])["gpu"])
            capped = status_of(stream, uuid, outcome=pb.OUTCOME_ENFORCED, applied_watts=400)
            assert capped.clamp_direction == pb.CLAMP_DIRECTION_LOWERED_TO_CEILING
            assert (capped.requested_watts, capped.resolved_watts) == (450, 450)
            assert node.writes(uuid) == [400_000]

            def clamped() -> list[dict[str, Any]]:
                path = (
                    f"/api/v1/namespaces/{ns}/events?fieldSelector="
                    f"involvedObject.name=job,reason=PowerCapClamped"
                )
                return list(cluster.request("GET", path)["items"])

            (event,) = wait_until(clamped, timeout=CYCLE_S, what="the PowerCapClamped Event")
            assert "the cluster's ceiling" in event["message"]


def test_the_clusters_ceiling_clamps_an_annotations_cap(
    cluster: ControlPlane, helm: Helm, tmp_path: Path, fake_nvml_library: Path
) -> None:
    """agent.caps.ceilingWatts 200: the workload's annotation asks 250 W, 200 W is written,
    and the pod is told why."""
    with claims_scene(cluster, helm, tmp_path, ("--set", "agent.caps.ceilingWatts=200")) as scene:
        run = start_agent(scene)
        try:
            wait_until(lambda: run.writes() != [], timeout=CYCLE_S, what="the workload capped")
            assert run.writes()[0] == 200_000 < CAP_W * 1000

            def told() -> list[dict[str, Any]]:
                return [e for e in run.events() if e["reason"] == "PowerCapClamped"]

            (event,) = wait_until(told, timeout=CYCLE_S, what="the PowerCapClamped Event")
            assert event["message"].endswith(f"{CAP_W} W is outside the cluster's bounds"), event[
                "message"
            ]
        finally:
            run.process.popen.terminate()
            run.process.wait(timeout=30)
