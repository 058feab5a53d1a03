"""Caps from DRA claims in the reconciler: a GPU allocated to a capped claim is capped
from the first cycle, with no process on it; released when its pod goes; each GPU its
own cap; invalid parameters and unmapped devices named, never skipped; a claim that
cannot be read or resolved leaves its pods' GPUs as they are (fail closed)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from capwatch.agent.attribution import Attributor, FsProcRoot
from capwatch.agent.gpus import GpuErrorClass
from capwatch.agent.health.faults import FaultKind
from capwatch.agent.ownership import OwnershipStore
from capwatch.agent.pods import PodInfo, PodRef
from capwatch.agent.reconciling import Reconciler
from capwatch.agent.reports import (
    AbortReason,
    CapSource,
    CycleFailureKind,
    CycleReport,
    GpuResult,
    Outcome,
    Reason,
    SafeDefaultCause,
)
from capwatch.agent.stepping import Policy
from capwatch.kit.clock import FakeClock
from tests.claims_objects import GPU, NODE, POD, capwatch, claim, power_cap, slice_of
from tests.contract.rigs import DEFAULT_W, GPU_COUNT, UUIDS, Op, SimRig
from tests.fakes.claims import StaticClaimView
from tests.fakes.pods import StaticPodView

KEY = "capwatch.io/gpu-power-limit"
SAFE_W = 250
ANNOTATED = PodInfo(
    ref=PodRef(namespace="ml", name="annotated", uid="aaaaaaaa-0000-4000-8000-000000000101"),
    annotations={KEY: "150"},
)


class Node:
    """A reconciler over the simulator, with settable pods and claims."""

    def __init__(self, tmp_path: Path) -> None:
        self.rig = SimRig(tmp_path / "proc")
        self.pods = StaticPodView([PodInfo(ref=POD, annotations={}), ANNOTATED])
        self.claims = StaticClaimView(NODE)
        self.claims.set(slices=[slice_of(uuids=UUIDS)])
        store = OwnershipStore(tmp_path / "state", clock=FakeClock())
        store.load()
        self.reconciler = Reconciler(
            backend=self.rig.backend,
            pods=self.pods,
            attributor=Attributor(FsProcRoot(tmp_path / "proc")),
            store=store,
            clock=FakeClock(),
            policy=Policy(annotation_key=KEY, safe_default_watts=SAFE_W),
            initial_device_count=GPU_COUNT,
            listeners=self.rig.listeners,
            claims=self.claims,
        )

    def set_claims(
        self, claims: list[dict[str, Any]], *, pods: tuple[PodInfo, ...] | None = None
    ) -> None:
        """The claims the API server holds; each pod of the node names those reserved for it."""
        self.claims.set(claims=claims)
        using: dict[str, list[str]] = {}
        for obj in claims:
            for reserved in obj["status"].get("reservedFor", []):
                using.setdefault(reserved["uid"], []).append(obj["metadata"]["name"])
        self.uses(using, pods=pods)

    def uses(self, using: dict[str, list[str]], *, pods: tuple[PodInfo, ...] | None = None) -> None:
        """The node's pods (by default the two), each naming the claims ``using`` gives it."""
        self.pods.set_pods(
            replace(pod, claims=tuple(using.get(pod.ref.uid, ())))
            for pod in (pods if pods is not None else (PodInfo(ref=POD), ANNOTATED))
        )

    def cycle(self) -> CycleReport:
        return self.reconciler.reconcile_once()

    def watts(self, index: int) -> int:
        return self.rig.limit_mw(index) // 1000


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def gpu(report: CycleReport, index: int) -> GpuResult:
    return report.gpus[index]


def test_an_idle_gpu_is_capped_from_the_first_cycle_after_its_claim_is_allocated(node: Node):
    """No process runs on GPU 1, but a claim reserved for a pod of this node holds it and
    asks 350 W: the first cycle caps it, says the cap came from the claim and names it;
    the other GPUs stay idle."""
    node.set_claims([claim("train", {"gpu": "gpu-1"}, config=[capwatch(power_cap(350))])])
    report = node.cycle()
    assert report.enforced
    result = gpu(report, 1)
    assert (result.outcome, result.cap_source, result.applied_watts) == (
        Outcome.ENFORCED,
        CapSource.CLAIM,
        350,
    )
    assert [str(c) for c in result.claims] == ["ml/train"]
    assert result.owners == (POD,)
    assert result.process_count == 0
    assert result.message == "capped at 350 W (claim ml/train)"
    assert result.dra_device is not None
    assert (result.dra_device.pool, result.dra_device.device) == (NODE, "gpu-1")
    assert node.watts(1) == 350
    assert [gpu(report, i).outcome for i in (0, 2)] == [Outcome.IDLE, Outcome.IDLE]


def test_the_cap_is_released_when_no_pod_uses_the_claim(node: Node):
    """Once the pod stops naming the claim (its claims released with it), the next cycle
    restores the GPU's default."""
    node.set_claims([claim("train", {"gpu": "gpu-0"}, config=[capwatch(power_cap(350))])])
    assert gpu(node.cycle(), 0).applied_watts == 350
    node.set_claims([])
    result = gpu(node.cycle(), 0)
    assert result.outcome is Outcome.RELEASED
    assert node.watts(0) == DEFAULT_W


def test_a_claim_its_pod_still_names_but_that_cannot_be_read_keeps_the_cap(node: Node):
    """The pod still names its claim, but the claim cannot be read (here: not found): its
    GPU is neither released nor written, and the cycle fails naming the claim; once the
    claim reads again the cap goes on as before."""
    train = claim("train", {"gpu": "gpu-0"}, config=[capwatch(power_cap(350))])
    node.set_claims([train])
    assert gpu(node.cycle(), 0).applied_watts == 350
    node.claims.set(claims=[])  # the pod still names it
    report = node.cycle()
    assert not report.enforced
    (failure,) = report.failures
    assert failure.kind is CycleFailureKind.CLAIM_UNAVAILABLE
    assert failure.message == "claim ml/train: not found"
    result = gpu(report, 0)
    assert (result.outcome, result.reason) == (Outcome.FAILED, Reason.CLAIM_HELD)
    assert result.message == "cap left as it is: claim ml/train: not found"
    assert node.watts(0) == 350
    node.claims.set(claims=[train])
    report = node.cycle()
    assert report.enforced
    assert gpu(report, 0).applied_watts == 350


def test_the_cap_is_released_when_the_pod_using_it_is_gone(node: Node):
    """A claim still allocated but used by no pod bound to this node asks nothing: the
    GPU goes back to its default."""
    node.set_claims([claim("train", {"gpu": "gpu-0"}, config=[capwatch(power_cap(350))])])
    node.cycle()
    node.uses({}, pods=(ANNOTATED,))
    assert gpu(node.cycle(), 0).outcome is Outcome.RELEASED
    assert node.watts(0) == DEFAULT_W


def test_invalid_parameters_give_the_safe_default_with_the_claim_named(node: Node):
    """watts as a string is not a PowerCap: the GPU gets the safe default, counted as
    invalid, and its message names the claim and what is wrong with it."""
    node.set_claims([claim("bad", {"gpu": "gpu-2"}, config=[capwatch(power_cap("350"))])])
    result = gpu(node.cycle(), 2)
    assert (result.outcome, result.cap_source, result.safe_default_cause) == (
        Outcome.ENFORCED,
        CapSource.SAFE_DEFAULT,
        SafeDefaultCause.INVALID,
    )
    assert result.applied_watts == SAFE_W
    assert [str(c) for c in result.claims] == ["ml/bad"]
    assert result.claim_problem == "claim ml/bad: watts '350' is not an integer"
    assert result.message.endswith(": claim ml/bad: watts '350' is not an integer")


def test_each_gpu_gets_its_own_cap_from_two_claims_or_two_requests(node: Node):
    """One pod holding two claims, and one claim with two requests configured apart: each
    GPU is capped at what its own claim or request asks."""
    node.set_claims(
        [
            claim("a", {"gpu": "gpu-0"}, config=[capwatch(power_cap(150))]),
            claim(
                "b",
                {"big": "gpu-1", "small": "gpu-2"},
                config=[capwatch(power_cap(390), "big"), capwatch(power_cap(120), "small")],
            ),
        ]
    )
    report = node.cycle()
    assert [gpu(report, i).applied_watts for i in range(3)] == [150, 390, 120]
    assert [str(gpu(report, i).claims[0]) for i in range(3)] == ["ml/a", "ml/b", "ml/b"]


def test_a_claim_wins_over_the_annotation_of_the_pod_running_on_its_gpu(node: Node):
    """The annotated pod's process runs on GPU 0 and asks 150 W; a claim holding GPU 0
    asks 350 W: the claim decides. When the claim goes, the annotation rules again."""
    node.rig.run(0, {4242: ANNOTATED.ref.uid})
    node.set_claims([claim("train", {"gpu": "gpu-0"}, config=[capwatch(power_cap(350))])])
    result = gpu(node.cycle(), 0)
    assert (result.cap_source, result.applied_watts) == (CapSource.CLAIM, 350)
    assert set(result.owners) == {POD, ANNOTATED.ref}
    node.set_claims([])
    result = gpu(node.cycle(), 0)
    assert (result.cap_source, result.applied_watts) == (CapSource.ANNOTATION, 150)


def test_a_capped_device_without_a_uuid_fails_the_cycle_naming_claim_and_device(node: Node):
    """A claim asks a cap of gpu-7, which this node's slice does not list: the cycle is not
    enforced and says which claim and device; the GPUs themselves are still reconciled."""
    node.set_claims(
        [
            claim("lost", {"gpu": "gpu-7"}, config=[capwatch(power_cap(300))]),
            claim("fine", {"gpu": "gpu-0"}, config=[capwatch(power_cap(300))]),
        ]
    )
    report = node.cycle()
    assert not report.enforced
    (failure,) = report.failures
    assert failure.kind is CycleFailureKind.CLAIM_DEVICE_UNMAPPED
    assert failure.message == (
        f"claim ml/lost: device {GPU}/{NODE}/gpu-7: device gpu-7 is not in pool "
        f"{GPU}/{NODE} generation 1"
    )
    assert gpu(report, 0).applied_watts == 300


def test_a_claims_view_out_of_sync_aborts_the_cycle_before_any_write(node: Node):
    """Without a synced claims view the cycle cannot know which cap a claim asks: it aborts
    as an unsynced pod view does, and writes nothing."""
    node.claims.set_unsynced("claims view not listed yet")
    report = node.cycle()
    assert report.abort_reason is AbortReason.POD_VIEW_NOT_SYNCED
    assert node.rig.writes() == []


def test_the_nodes_slice_deleted_keeps_the_claims_cap_and_fails_the_cycle(node: Node):
    """A driver restart deletes the node's ResourceSlice: the claimed GPU is not
    uncapped (the claim's cap stays on the GPU its device resolved to) and the cycle is
    not enforced, naming the claim, the device and the GPU the cap stays on."""
    node.set_claims([claim("train", {"gpu": "gpu-1"}, config=[capwatch(power_cap(350))])])
    assert node.cycle().enforced
    node.claims.set(slices=[])
    report = node.cycle()
    assert not report.enforced
    (failure,) = report.failures
    assert failure.kind is CycleFailureKind.CLAIM_DEVICE_UNMAPPED
    assert failure.message.endswith(f"; its cap stays on {UUIDS[1]}")
    result = gpu(report, 1)
    assert (result.outcome, result.applied_watts) == (Outcome.ENFORCED, 350)
    assert node.watts(1) == 350


def test_a_republish_naming_another_gpu_for_the_device_does_not_move_the_cap(node: Node):
    """The driver republishes with gpu-1 now naming GPU 2's UUID: GPU 1 (where the
    workload was prepared) keeps the cap, GPU 2 is left idle, and the move is named."""
    node.set_claims([claim("train", {"gpu": "gpu-1"}, config=[capwatch(power_cap(350))])])
    node.cycle()
    swapped = slice_of(uuids=(UUIDS[0], UUIDS[2], UUIDS[1]))
    swapped["spec"]["pool"]["generation"] = 2
    node.claims.set(slices=[swapped])
    report = node.cycle()
    (failure,) = report.failures
    assert failure.kind is CycleFailureKind.CLAIM_DEVICE_MOVED
    assert UUIDS[2] in failure.message
    assert (gpu(report, 1).applied_watts, gpu(report, 2).outcome) == (350, Outcome.IDLE)
    assert node.watts(2) == DEFAULT_W


def test_a_gpu_that_stops_answering_keeps_its_identity_and_its_slices_name(node: Node):
    """GPU 1 is lost (every call answers GPU_IS_LOST): its step cannot read its UUID, yet
    its result names the UUID it last answered with and the device its slice names, so
    the streams, the DRA mirror and any DeviceTaintRule keep naming the same device
    through the fault (not an empty UUID and the gpu-{index} template)."""
    assert node.cycle().enforced
    node.rig.fail(Op.UUID, 1, GpuErrorClass.GPU_IS_LOST)
    report = node.cycle()
    lost = gpu(report, 1)
    assert lost.reason is Reason.UUID_READ_FAILED
    assert lost.uuid == UUIDS[1]
    assert lost.dra_device is not None
    assert (lost.dra_device.driver, lost.dra_device.pool, lost.dra_device.device) == (
        GPU,
        NODE,
        "gpu-1",
    )
    assert [f.kind for f in lost.faults] == [FaultKind.GPU_LOST]
