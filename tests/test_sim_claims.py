"""The simulated node's DRA claims (agent/sim/claims.py): the scenario's claims and slices
as resource.k8s.io/v1 objects, joined by the agent's own code, and what the real
reconciler makes of them cycle by cycle: a claimed GPU capped before its process
starts, released when the claim ends, the safe default for an invalid claim."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml

from capwatch.agent.assembly import build_agent
from capwatch.agent.attribution import Attributor
from capwatch.agent.capping import DEFAULT_ANNOTATION_KEY
from capwatch.agent.dra.claims import API_VERSION, DRIVER, KIND, ClaimRef
from capwatch.agent.dra.slices import DeviceName
from capwatch.agent.ownership import OwnershipStore
from capwatch.agent.reconciling import Reconciler
from capwatch.agent.reports import (
    CapSource,
    CycleFailureKind,
    CycleReport,
    Outcome,
    SafeDefaultCause,
)
from capwatch.agent.settings import add_agent_arguments, agent_settings
from capwatch.agent.sim.claims import SimClaimView, claim_objects, slice_objects
from capwatch.agent.sim.scenario import Scenario, parse_scenario
from capwatch.agent.sim.views import SimGpuBackend, SimPodView
from capwatch.agent.sim.world import SimWorld
from capwatch.agent.stepping import Policy
from capwatch.kit.clock import FakeClock
from capwatch.kit.errors import PodViewError

UID_A = "11111111-2222-4333-8444-555555555555"
UID_B = "66666666-7777-4888-8999-aaaaaaaaaaaa"
GPU0, GPU1 = "GPU-aaaa-0", "GPU-aaaa-1"
NVIDIA = "gpu.nvidia.com"


def power_cap(watts: object, **changes: object) -> dict[str, object]:
    return {"apiVersion": API_VERSION, "kind": KIND, "watts": watts, **changes}


def document(**extra: Any) -> dict[str, Any]:
    """Two GPUs (100-400 W, default 400 W). Pod ``job`` (annotated 250 W) is bound from
    cycle 2 and its process runs on GPU 0 from cycle 4; its claim, allocated GPU 0 in
    cycles 2-5, asks 300 W. Pod ``other`` runs on GPU 1 throughout, annotated 200 W."""
    doc: dict[str, Any] = {
        "node_name": "n",
        "safe_default_watts": 150,
        "gpus": [
            {"uuid": GPU0, "min_watts": 100, "max_watts": 400, "default_watts": 400},
            {"uuid": GPU1, "min_watts": 100, "max_watts": 400, "default_watts": 400},
        ],
        "pods": [
            {
                "namespace": "ml",
                "name": "job",
                "uid": UID_A,
                "annotations": {DEFAULT_ANNOTATION_KEY: "250"},
                "cycles": {"from": 2},
            },
            {
                "namespace": "ml",
                "name": "other",
                "uid": UID_B,
                "annotations": {DEFAULT_ANNOTATION_KEY: "200"},
            },
        ],
        "processes": [
            {"gpu": 0, "pid": 10, "pod": UID_A, "cycles": {"from": 4}},
            {"gpu": 1, "pid": 20, "pod": UID_B},
        ],
        "claims": [
            {
                "namespace": "ml",
                "name": "job-gpu",
                "reserved_for": ["job"],
                "devices": [0],
                "parameters": power_cap(300),
                "cycles": {"from": 2, "to": 5},
            }
        ],
    }
    doc.update(extra)
    return doc


def scenario(**extra: Any) -> Scenario:
    return parse_scenario(document(**extra), source="test")


class Node:
    """The real reconciler over a simulated node, with the scenario's claims."""

    def __init__(self, tmp_path: Path, s: Scenario, *, uuid_attribute: str = "uuid") -> None:
        self.world = SimWorld(s)
        clock = FakeClock()
        backend = SimGpuBackend(self.world)
        self.claims = SimClaimView(self.world, node=s.node_name, uuid_attribute=uuid_attribute)
        self.reconciler = Reconciler(
            backend=backend,
            pods=SimPodView(self.world),
            attributor=Attributor(self.world),
            store=OwnershipStore(tmp_path / "state", clock=clock),
            clock=clock,
            policy=Policy(
                annotation_key=DEFAULT_ANNOTATION_KEY, safe_default_watts=s.safe_default_watts
            ),
            initial_device_count=backend.device_count(),
            listeners=[self.world],
            claims=self.claims,
        )

    def cycles(self, count: int) -> list[CycleReport]:
        return [self.reconciler.reconcile_once() for _ in range(count)]


JOB_CLAIM = ClaimRef(namespace="ml", name="job-gpu")


def test_slices_are_derived_from_the_gpus_as_the_nvidia_driver_publishes_them() -> None:
    """Without ``slices``: one resource.k8s.io/v1 ResourceSlice of driver gpu.nvidia.com for
    the agent's node, a pool named for it, a device gpu-N per GPU carrying its UUID."""
    (found,) = slice_objects(scenario(), node="other-name")
    assert (found["apiVersion"], found["kind"]) == ("resource.k8s.io/v1", "ResourceSlice")
    spec = found["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]["name"]) == (
        NVIDIA,
        "other-name",
        "other-name",
    )
    assert [(d["name"], d["attributes"]["uuid"]) for d in spec["devices"]] == [
        ("gpu-0", {"string": GPU0}),
        ("gpu-1", {"string": GPU1}),
    ]


def test_a_claim_is_an_allocated_resource_claim_reserved_for_its_pods() -> None:
    """A claim within its cycles is a ResourceClaim whose allocation names each device
    (driver, the node's pool, device) and carries its capwatch.io config, reserved for
    its pods; outside its cycles it is not listed; its parameters are copies."""
    s = scenario()
    assert claim_objects(s, cycle=1, node="n") == []
    assert claim_objects(s, cycle=6, node="n") == []
    (found,) = claim_objects(s, cycle=2, node="n")
    assert (found["apiVersion"], found["kind"]) == ("resource.k8s.io/v1", "ResourceClaim")
    assert (found["metadata"]["namespace"], found["metadata"]["name"]) == ("ml", "job-gpu")
    devices = found["status"]["allocation"]["devices"]
    assert devices["results"] == [
        {"request": "gpu", "driver": NVIDIA, "pool": "n", "device": "gpu-0"}
    ]
    assert devices["config"] == [
        {
            "source": "FromClaim",
            "requests": ["gpu"],
            "opaque": {"driver": DRIVER, "parameters": power_cap(300)},
        }
    ]
    assert found["status"]["reservedFor"] == [{"resource": "pods", "name": "job", "uid": UID_A}]
    devices["config"][0]["opaque"]["parameters"]["watts"] = 1
    assert s.claims[0].cap is not None
    assert s.claims[0].cap.value == power_cap(300), "the scenario is not changed through it"


def test_the_claim_view_serves_the_agents_join_for_the_current_cycle() -> None:
    """The view's snapshot is agent.dra.claims.claims_snapshot of the claims the cycle's pods
    use (each pod uses the claims reserved for it): the claim's cap on GPU 0's UUID (with
    its pod) while allocated, the driver's name for every GPU; a closed view raises
    PodViewError as the pod view does."""
    world = SimWorld(scenario())
    view = SimClaimView(world, node="n")
    pods = SimPodView(world)
    world.begin_cycle(1)
    assert view.snapshot(pods.snapshot()).caps == {}
    world.begin_cycle(3)
    snap = view.snapshot(pods.snapshot())
    (cap,) = snap.caps[GPU0]
    assert (cap.claim.namespace, cap.claim.name, cap.watts, cap.problem) == (
        "ml",
        "job-gpu",
        300,
        None,
    )
    assert [p.uid for p in cap.pods] == [UID_A]
    assert snap.names[GPU1] == DeviceName(driver=NVIDIA, pool="n", device="gpu-1")
    assert snap.problems == ()
    view.close()
    view.close()
    with pytest.raises(PodViewError, match="closed"):
        view.snapshot(pods.snapshot())


def test_a_claimed_gpu_is_capped_before_its_process_starts(tmp_path: Path) -> None:
    """From the cycle the claim is allocated and its pod bound (2), GPU 0 is enforced at the
    claim's 300 W with cap source claim, the claim named and the pod its owner, while no
    process runs on it (cycles 2-3); its process (4) changes nothing. The claim wins over
    the pod's 250 W annotation. Before (1) the GPU is idle and never written."""
    node = Node(tmp_path, scenario())
    reports = node.cycles(5)
    assert all(r.enforced for r in reports)
    gpu0 = [r.gpus[0] for r in reports]
    assert gpu0[0].outcome is Outcome.IDLE
    for result, processes in zip(gpu0[1:], (0, 0, 1, 1), strict=True):
        assert result.outcome is Outcome.ENFORCED
        assert (result.applied_watts, result.cap_source) == (300, CapSource.CLAIM)
        assert [(c.namespace, c.name) for c in result.claims] == [("ml", "job-gpu")]
        assert "claim ml/job-gpu" in result.message
        assert [p.uid for p in result.owners] == [UID_A]
        assert result.process_count == processes
        assert result.dra_device == DeviceName(driver=NVIDIA, pool="n", device="gpu-0")
    assert [w.cycle for w in node.world.writes() if w.index == 0] == [2, 3, 4, 5]
    assert node.world.limit_milliwatts(0) == 300_000


def test_when_the_claims_cycles_end_the_gpu_falls_back_or_is_released(tmp_path: Path) -> None:
    """After the claim's last cycle (5) the GPU whose pod still runs goes back to the
    annotation's rule (250 W, source annotation); a claimed GPU with nothing on it is
    released (its default restored) in the first cycle after its claim."""
    node = Node(tmp_path, scenario())
    reports = node.cycles(7)
    after = reports[5].gpus[0]
    assert (after.outcome, after.applied_watts, after.cap_source) == (
        Outcome.ENFORCED,
        250,
        CapSource.ANNOTATION,
    )
    assert after.claims == ()
    idle = document(processes=[{"gpu": 1, "pid": 20, "pod": UID_B}])
    node = Node(tmp_path / "idle", parse_scenario(idle, source="test"))
    gpu0 = [r.gpus[0] for r in node.cycles(7)]
    assert [g.outcome for g in gpu0] == [Outcome.IDLE] + [Outcome.ENFORCED] * 4 + [
        Outcome.RELEASED,
        Outcome.IDLE,
    ]
    assert node.world.limit_milliwatts(0) == 400_000


def test_a_claim_reserved_for_a_pod_not_yet_bound_caps_nothing(tmp_path: Path) -> None:
    """The claim counts only once a pod it is reserved for is in the pod view: allocated
    from cycle 1 but its pod bound from 2, GPU 0 is idle in cycle 1."""
    doc = document()
    doc["claims"][0]["cycles"] = {"from": 1, "to": 5}
    gpu0 = [r.gpus[0] for r in Node(tmp_path, parse_scenario(doc, source="t")).cycles(2)]
    assert [g.outcome for g in gpu0] == [Outcome.IDLE, Outcome.ENFORCED]


@pytest.mark.parametrize(
    ("parameters", "problem"),
    [
        (power_cap("300"), "watts '300' is not an integer"),
        (power_cap(300, kind="PowerLimit"), "kind 'PowerLimit' is not PowerCap"),
        (power_cap(300, apiVersion="capwatch.io/v2"), "apiVersion 'capwatch.io/v2'"),
        (power_cap(0), "watts 0 is out of range"),
        (power_cap(300, milliwatts=300_000), "unknown field 'milliwatts'"),
    ],
)
def test_an_invalid_claim_gives_the_safe_default_with_the_claim_named(
    tmp_path: Path, parameters: object, problem: str
) -> None:
    """Parameters that are not a valid PowerCap, simulated as written on the claim, give
    the GPU the safe default (150 W, cause invalid) with the claim named and why, in place
    of the pod's annotation: an invalid claim is not a fallback to the annotation."""
    doc = document()
    doc["claims"][0]["parameters"] = parameters
    result = Node(tmp_path, parse_scenario(doc, source="t")).cycles(2)[1].gpus[0]
    assert (result.outcome, result.applied_watts) == (Outcome.ENFORCED, 150)
    assert (result.cap_source, result.safe_default_cause) == (
        CapSource.SAFE_DEFAULT,
        SafeDefaultCause.INVALID,
    )
    assert [(c.namespace, c.name) for c in result.claims] == [("ml", "job-gpu")]
    assert f"claim ml/job-gpu: {problem}" in result.message


def test_a_claim_without_a_capwatch_config_leaves_the_annotation_rule(tmp_path: Path) -> None:
    """A claim with no capwatch.io config is not capwatch's: the idle claimed GPU is not
    written, and once its process runs the pod's annotation decides."""
    doc = document()
    del doc["claims"][0]["parameters"]
    gpu0 = [r.gpus[0] for r in Node(tmp_path, parse_scenario(doc, source="t")).cycles(4)]
    assert [g.outcome for g in gpu0] == [Outcome.IDLE] * 3 + [Outcome.ENFORCED]
    assert (gpu0[3].applied_watts, gpu0[3].cap_source) == (250, CapSource.ANNOTATION)


def test_a_device_no_slice_maps_fails_the_cycle_naming_claim_and_device(tmp_path: Path) -> None:
    """Given slices in which the claimed device has no UUID: every cycle the claim is
    allocated fails with claim_device_unmapped, naming the claim and the device; the
    other GPUs are still capped."""
    slices = [
        {
            "devices": [
                {"name": "gpu-0", "uuid": GPU0},
                {"name": "gpu-1", "uuid": GPU1},
                {"name": "gpu-2"},
            ]
        }
    ]
    doc = document(slices=slices)
    doc["claims"][0]["devices"] = ["gpu-2"]
    reports = Node(tmp_path, parse_scenario(doc, source="t")).cycles(3)
    assert reports[0].enforced
    for report in reports[1:]:
        (failure,) = report.failures
        assert failure.kind is CycleFailureKind.CLAIM_DEVICE_UNMAPPED
        assert "claim ml/job-gpu" in failure.message
        assert f"{NVIDIA}/n/gpu-2" in failure.message
        assert report.gpus[1].applied_watts == 200


def test_a_uuid_attribute_the_agent_does_not_read_leaves_devices_unmapped(tmp_path: Path) -> None:
    """A slice whose UUID attribute is not the one the agent is told to read
    (--dra-uuid-attribute) maps no device, as on a real node: the claim's cap is a
    named failure, not silently dropped."""
    report = Node(tmp_path, scenario(), uuid_attribute="gpu-uuid").cycles(2)[1]
    assert [f.kind for f in report.failures] == [CycleFailureKind.CLAIM_DEVICE_UNMAPPED]
    assert report.gpus[0].outcome is Outcome.IDLE


@pytest.mark.parametrize(("flag", "source"), [("true", CapSource.CLAIM), ("false", None)])
def test_the_sim_agent_reads_the_scenarios_claims_unless_told_not_to(
    tmp_path: Path, flag: str, source: CapSource | None
) -> None:
    """Assembled from its settings, the sim agent caps the claimed, idle GPU 0 through its
    claim in cycle 2; with --dra-claims=false it ignores claims and leaves GPU 0 idle."""
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(document()), encoding="utf-8")
    parser = argparse.ArgumentParser()
    add_agent_arguments(parser)
    argv = ["--gpu-backend", "sim", "--scenario", str(path), "--state-dir", str(tmp_path / "st")]
    settings = agent_settings(parser.parse_args([*argv, f"--dra-claims={flag}"]), {})
    agent = build_agent(settings)
    try:
        second = [agent.reconciler.reconcile_once() for _ in range(2)][1].gpus[0]
    finally:
        agent.close()
    assert second.cap_source is source
    assert second.outcome is (Outcome.IDLE if source is None else Outcome.ENFORCED)
