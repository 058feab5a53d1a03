"""Caps from DRA ResourceClaims, end to end on the real API server (issue 19).

One control plane for the module: kube-apiserver auditing every request, the real
kube-controller-manager (its resourceclaim controller makes a template's claims,
deallocates a claim whose pods are gone or done, and with the garbage collector deletes
a template's claim with its pod), the real kube-scheduler (its DRA plugin allocates each
claim from the node's ResourceSlice and reserves it for the pod it binds) and KWOK (the
nodes stay Ready, the pods go Running; no process ever runs on a GPU). Each test has a
node of its own with a ResourceSlice like NVIDIA's GPU driver publishes
(tests/realkube/dra.py) and a real ``capwatch agent`` there on the fake NVML, with the
chart's rendered args, as the chart's ServiceAccount under the chart's rendered RBAC; the
audit log shows none of its calls refused. No test writes a claim's ``status``.

What the server does, as these tests pin it down: the scheduler writes
``status.allocation`` (each device by driver, pool, device name) with the claim's
configuration copied into ``status.allocation.devices.config`` (``source: FromClaim``;
``requests`` dropped when the entry applies to every request of the claim; opaque
parameters stored as written, valid PowerCap or not) and ``status.reservedFor`` the pod,
with the ``resource.kubernetes.io/delete-protection`` finalizer, and binds the pod.
When the pod is deleted, the claim made from its template is deleted (the resourceclaim
controller releases it, the garbage collector deletes it: its owner is gone); when the
pod finishes (Succeeded, still bound to the node), the resourceclaim controller clears
``reservedFor`` and the allocation and drops the finalizer, and the claim stays.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from tests.chart.support import Helm
from tests.controller.e2e.processes import wait_until
from tests.realkube.audit import AuditLog
from tests.realkube.claims_cluster import (
    CONTROLLER_S,
    DELETE_PROTECTION,
    NAMESPACED,
    assert_agent_allowed,
    assert_capped_from_idle,
    audit,
    claim_refs,
    claims_of,
    claims_scene,
    cluster,
    scheduled,
    status_of,
)
from tests.realkube.controlplane import ControlPlane
from tests.realkube.dra import (
    CAPWATCH_DRIVER,
    PodClaim,
    allocated_config,
    allocated_devices,
    cap_config,
    claim_spec,
    create_claim,
    create_claim_template,
    create_claiming_pod,
    dra_devices,
    get_claim,
    get_pod,
    power_cap,
)
from tests.realkube.dra_node import DEFAULT_MW, SAFE_DEFAULT_W, start_dra_node

__all__ = ["audit", "cluster"]  # the module's fixtures, from claims_cluster

pytestmark = [pytest.mark.slow, pytest.mark.nvml, pytest.mark.timeout(180)]


@pytest.mark.parametrize("values", [(), NAMESPACED], ids=["cluster", "namespaced"])
def test_a_template_claim_caps_its_gpu_with_no_process_and_is_released_with_its_pod(
    cluster: ControlPlane,
    helm: Helm,
    tmp_path: Path,
    audit: AuditLog,
    fake_nvml_library: Path,
    values: tuple[str, ...],
) -> None:
    """A pod whose ResourceClaimTemplate asks 450 W through capwatch's config: the real
    controller makes its claim, the real scheduler allocates it a GPU of the node's slice
    and binds the pod, KWOK runs it with no process on any GPU. The agent caps exactly that
    GPU (joined by the slice's UUID, not by index) at 450 W straight from idle, and its
    capwatch.v1 stream says cap_source CLAIM naming the claim, the pod as owner, and the
    slice's pool and device names, which its DRA health mirror uses too. The pod deleted,
    the claim is deleted and the GPU's default limit restored. Under the ClusterRole and
    under rbac.namespaced's Role and slices ClusterRole alike, no call refused, one LIST of
    pods and of slices in all, the claim read by name."""
    mark = audit.mark()
    with claims_scene(cluster, helm, tmp_path, values) as scene:
        ns = scene.namespace
        node = start_dra_node(scene)
        with node.stream() as stream:
            spec = claim_spec(["gpu"], [cap_config(power_cap(450), ["gpu"])])
            create_claim_template(cluster, ns, "gpu-450w", spec)
            create_claiming_pod(
                cluster, ns, "trainer", node.name, [PodClaim("gpu", template="gpu-450w")]
            )
            pod = scheduled(cluster, ns, "trainer", node.name)
            claim = claims_of(cluster, pod)["gpu"]
            name = claim["metadata"]["name"]
            assert claim["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
            assert DELETE_PROTECTION in claim["metadata"]["finalizers"]
            # The scheduler copied the config; one request only, so it applies to all.
            assert allocated_config(claim) == [
                {
                    "source": "FromClaim",
                    "opaque": {"driver": CAPWATCH_DRIVER, "parameters": power_cap(450)},
                }
            ]
            ((request, device),) = allocated_devices(claim).items()
            assert request == "gpu"
            uuid = node.device_of(device)
            (other,) = set(node.devices.values()) - {uuid}

            capped = status_of(stream, uuid, outcome=pb.OUTCOME_ENFORCED, applied_watts=450)
            assert capped.cap_source == pb.CAP_SOURCE_CLAIM
            assert claim_refs(capped) == [(ns, name)]
            assert capped.claims[0].uid == claim["metadata"]["uid"]
            assert f"claim {ns}/{name}" in capped.message
            assert [(o.namespace, o.name) for o in capped.owners] == [(ns, "trainer")]
            assert (capped.dra_pool_name, capped.dra_device_name) == (node.name, device[2])
            assert capped.index == node.nvml.index(uuid) != int(device[2].removeprefix("gpu-"))
            assert_capped_from_idle(node, stream, uuid, 450)
            assert stream.latest(other).outcome == pb.OUTCOME_IDLE  # type: ignore[union-attr]
            assert node.writes(other) == []

            mirror = dra_devices(node.address, node.name)
            assert set(mirror) == {(node.name, d) for d in node.devices}
            assert mirror[(node.name, device[2])].message == "capwatch: power cap enforced"

            cluster.request("DELETE", f"/api/v1/namespaces/{ns}/pods/trainer")
            wait_until(
                lambda: get_claim(cluster, ns, name) is None,
                timeout=CONTROLLER_S,
                what=f"the template's claim {name} deleted with its pod",
            )
            released = status_of(stream, uuid, outcome=pb.OUTCOME_RELEASED)
            assert list(released.claims) == []
            assert node.writes(uuid)[-1] == DEFAULT_MW
    assert_agent_allowed(audit, scene, mark)


def test_a_finished_pods_claim_is_deallocated_and_its_gpu_released(
    cluster: ControlPlane, helm: Helm, tmp_path: Path, audit: AuditLog, fake_nvml_library: Path
) -> None:
    """A ResourceClaim of its own (config for every request: no ``requests``) capped at
    420 W; its pod then finishes (Succeeded, as a kubelet reports it) and stays bound to
    the node: the resourceclaim controller clears reservedFor and the allocation and drops
    its finalizer, the claim stays, and the agent, which still sees the pod on its node,
    releases the GPU: a finished pod's claims are not read (its processes are gone)."""
    mark = audit.mark()
    with claims_scene(cluster, helm, tmp_path) as scene:
        ns = scene.namespace
        node = start_dra_node(scene)
        with node.stream() as stream:
            create_claim(cluster, ns, "gpu-420w", claim_spec(["gpu"], [cap_config(power_cap(420))]))
            create_claiming_pod(
                cluster, ns, "worker", node.name, [PodClaim("gpu", claim="gpu-420w")]
            )
            pod = scheduled(cluster, ns, "worker", node.name)
            claim = claims_of(cluster, pod)["gpu"]
            assert "ownerReferences" not in claim["metadata"]
            uuid = node.device_of(allocated_devices(claim)["gpu"])
            capped = status_of(stream, uuid, outcome=pb.OUTCOME_ENFORCED, applied_watts=420)
            assert claim_refs(capped) == [(ns, "gpu-420w")]
            assert_capped_from_idle(node, stream, uuid, 420)

            pod["status"]["phase"] = "Succeeded"
            pod["status"]["containerStatuses"] = [
                {
                    **status,
                    "ready": False,
                    "started": False,
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
                }
                for status in pod["status"]["containerStatuses"]
            ]
            cluster.request("PUT", f"/api/v1/namespaces/{ns}/pods/worker/status", pod)

            def deallocated() -> dict[str, Any] | None:
                found = get_claim(cluster, ns, "gpu-420w")
                assert found is not None, "the claim itself must stay"
                status, finalizers = found.get("status", {}), found["metadata"].get("finalizers")
                done = not status.get("reservedFor") and not status.get("allocation")
                return found if done and not finalizers else None

            wait_until(deallocated, timeout=CONTROLLER_S, what="the claim deallocated")
            released = status_of(stream, uuid, outcome=pb.OUTCOME_RELEASED)
            assert list(released.claims) == []
            assert node.writes(uuid)[-1] == DEFAULT_MW
            still = get_pod(cluster, ns, "worker")
            assert still is not None
            assert still["spec"]["nodeName"] == node.name
    assert_agent_allowed(audit, scene, mark)


def test_invalid_parameters_give_the_safe_default_naming_the_claim(
    cluster: ControlPlane, helm: Helm, tmp_path: Path, audit: AuditLog, fake_nvml_library: Path
) -> None:
    """A pod with two claims whose PowerCaps are not valid, ``watts: "450"`` (a string) and
    ``kind: Wrong``: the server stores them as they are (opaque), the scheduler allocates
    both, and the agent writes each GPU the chart's safe default (300 W), cause INVALID,
    with the claim and what is wrong with it in the GPU's message and the claim in its
    ``claims``."""
    mark = audit.mark()
    with claims_scene(cluster, helm, tmp_path) as scene:
        ns = scene.namespace
        node = start_dra_node(scene)
        with node.stream() as stream:
            bad = {
                "watts-text": (power_cap("450"), "watts '450' is not an integer"),
                "kind-wrong": (power_cap(450, kind="Wrong"), "kind 'Wrong' is not PowerCap"),
            }
            for name, (parameters, _) in bad.items():
                create_claim(cluster, ns, name, claim_spec(["gpu"], [cap_config(parameters)]))
            entries = [PodClaim(f"c{i}", claim=name) for i, name in enumerate(bad)]
            create_claiming_pod(cluster, ns, "invalid", node.name, entries)
            pod = scheduled(cluster, ns, "invalid", node.name)
            claims = claims_of(cluster, pod)
            for entry in entries:
                claim = claims[entry.name]
                parameters, why = bad[entry.claim]
                assert allocated_config(claim)[0]["opaque"]["parameters"] == parameters
                uuid = node.device_of(allocated_devices(claim)["gpu"])
                status = status_of(
                    stream, uuid, outcome=pb.OUTCOME_ENFORCED, applied_watts=SAFE_DEFAULT_W
                )
                assert status.cap_source == pb.CAP_SOURCE_SAFE_DEFAULT
                assert status.safe_default_cause == pb.SAFE_DEFAULT_CAUSE_INVALID
                assert claim_refs(status) == [(ns, entry.claim)]
                assert f"claim {ns}/{entry.claim}: {why}" in status.message, status.message
                assert node.writes(uuid) == [SAFE_DEFAULT_W * 1000]
    assert_agent_allowed(audit, scene, mark)


def test_each_gpu_gets_the_cap_its_own_claim_or_request_asks(
    cluster: ControlPlane, helm: Helm, tmp_path: Path, audit: AuditLog, fake_nvml_library: Path
) -> None:
    """Four GPUs: one pod with two claims (450 W, 350 W), another with one claim of two
    requests whose configs name one request each (400 W, 250 W). Whichever GPU the
    scheduler gives each request, that GPU gets that request's cap, from its own claim."""
    mark = audit.mark()
    with claims_scene(cluster, helm, tmp_path) as scene:
        ns = scene.namespace
        node = start_dra_node(scene, gpus=4)
        with node.stream() as stream:
            for name, watts in (("big", 450), ("small", 350)):
                spec = claim_spec(["gpu"], [cap_config(power_cap(watts))])
                create_claim(cluster, ns, name, spec)
            pair = claim_spec(
                ["fast", "slow"],
                [cap_config(power_cap(400), ["fast"]), cap_config(power_cap(250), ["slow"])],
            )
            create_claim(cluster, ns, "pair", pair)
            two_claims = [PodClaim("a", claim="big"), PodClaim("b", claim="small")]
            create_claiming_pod(cluster, ns, "two-claims", node.name, two_claims)
            create_claiming_pod(
                cluster, ns, "two-requests", node.name, [PodClaim("p", claim="pair")]
            )
            expected: dict[str, tuple[int, str]] = {}  # uuid -> (watts, claim)
            watts_of = {("big", "gpu"): 450, ("small", "gpu"): 350}
            watts_of |= {("pair", "fast"): 400, ("pair", "slow"): 250}
            for pod_name in ("two-claims", "two-requests"):
                pod = scheduled(cluster, ns, pod_name, node.name)
                for claim in claims_of(cluster, pod).values():
                    claim_name = claim["metadata"]["name"]
                    for request, device in allocated_devices(claim).items():
                        expected[node.device_of(device)] = (
                            watts_of[claim_name, request],
                            claim_name,
                        )
            assert set(expected) == set(node.devices.values())
            for uuid, (watts, claim_name) in expected.items():
                status = status_of(stream, uuid, outcome=pb.OUTCOME_ENFORCED, applied_watts=watts)
                assert status.cap_source == pb.CAP_SOURCE_CLAIM
                assert claim_refs(status) == [(ns, claim_name)]
                assert_capped_from_idle(node, stream, uuid, watts)
    assert_agent_allowed(audit, scene, mark)
