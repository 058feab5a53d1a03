"""The claims join in its corners: pool generations, a device pinned to the GPU it was
prepared on, DRA's configuration order, claims that cannot be read, and which claims a
node's pods use (agent/dra/claims.py, agent/dra/slices.py, agent/kube/pod_wire.py)."""

from __future__ import annotations

from typing import Any

import pytest

from capwatch.agent.dra.claims import ClaimProblemKind, Pin, claims_snapshot, referenced_claims
from capwatch.agent.dra.slices import DeviceName, node_devices
from capwatch.agent.kube.pod_wire import pod_info
from capwatch.agent.pods import PodInfo, PodRef, PodSnapshot
from tests.claims_objects import (
    GPU,
    NODE,
    POD,
    UUIDS,
    capwatch,
    claim,
    join,
    power_cap,
    slice_of,
)

GPU0 = DeviceName(driver=GPU, pool=NODE, device="gpu-0")


def generation(number: int, *, count: int = 1, uuids: tuple[str, ...] = UUIDS) -> dict[str, Any]:
    """This node's slice of the pool at generation ``number`` of ``count`` slices."""
    item = slice_of(uuids=uuids)
    item["metadata"]["uid"] = f"slice-gen-{number}"
    item["spec"]["pool"] = {"name": NODE, "generation": number, "resourceSliceCount": count}
    return item


TRAIN = claim("train", {"gpu": "gpu-0"}, config=[capwatch(power_cap(350))])
SWAPPED = (UUIDS[1], UUIDS[0], UUIDS[2], UUIDS[3])


def test_only_the_newest_generation_of_a_pool_is_trusted():
    """During a republish both generations are listed: the older one's mapping is ignored,
    the newest (complete) one's is used."""
    snapshot = join([TRAIN], [generation(1), generation(2, uuids=SWAPPED)])
    assert list(snapshot.caps) == [UUIDS[1]]
    assert snapshot.problems == ()
    assert snapshot.names[UUIDS[1]] == GPU0


def test_an_incomplete_newest_generation_resolves_nothing_and_holds_the_pods():
    """Generation 2 says it has two slices and one is listed: the pool is being
    republished, so no device of it resolves (the older generation is not fallen back
    on), the claim is named, and its pods' GPUs keep their caps."""
    snapshot = join([TRAIN], [generation(1), generation(2, count=2, uuids=SWAPPED)])
    assert snapshot.caps == {}
    (problem,) = snapshot.problems
    assert problem.kind is ClaimProblemKind.UNMAPPED
    assert problem.detail == (
        f"pool {GPU}/{NODE} generation 2 has 1 of its 2 slices (being republished)"
    )
    assert snapshot.hold([POD.uid]) is problem
    assert snapshot.names == {}


def test_a_resolved_device_stays_on_its_gpu_when_the_slice_goes():
    """The node's slice is deleted (a driver restart): the claim's device no longer
    resolves, but it was resolved before, so its cap stays on that GPU, and the problem
    says so; its pods are not held (the cap is still written, on the right GPU)."""
    first = join([TRAIN], [generation(1)])
    assert list(first.caps) == [UUIDS[0]]
    pin = Pin(claim_uid="claim-train", request="gpu", device=GPU0)
    assert first.pins == {pin: UUIDS[0]}
    gone = join([TRAIN], [], pins=first.pins)
    assert [c.watts for c in gone.caps[UUIDS[0]]] == [350]
    (problem,) = gone.problems
    assert (problem.kind, problem.kept_on) == (ClaimProblemKind.UNMAPPED, UUIDS[0])
    assert problem.message() == (
        f"claim ml/train: device {GPU0}: no ResourceSlice of this node lists pool "
        f"{GPU}/{NODE}; its cap stays on {UUIDS[0]}"
    )
    assert gone.hold([POD.uid]) is None
    assert gone.pins == first.pins


def test_a_republish_that_names_another_gpu_never_moves_the_cap():
    """Generation 2 maps gpu-0 to what was gpu-1's UUID: the workload was prepared on the
    first GPU, so the cap stays there and the move is named, both GPUs given."""
    first = join([TRAIN], [generation(1)])
    moved = join([TRAIN], [generation(2, uuids=SWAPPED)], pins=first.pins)
    assert list(moved.caps) == [UUIDS[0]]
    (problem,) = moved.problems
    assert problem.kind is ClaimProblemKind.MOVED
    assert problem.detail == (
        f"this node's slices now name {UUIDS[1]} for it; it was prepared on {UUIDS[0]}"
    )


def test_a_pin_belongs_to_the_claim_by_uid_and_goes_with_it():
    """A claim made again under the same name (another uid) is resolved afresh, and pins
    of claims no pod uses any more are dropped."""
    first = join([TRAIN], [generation(1)])
    again = claim("train", {"gpu": "gpu-0"}, config=[capwatch(power_cap(350))])
    again["metadata"]["uid"] = "claim-train-2"
    fresh = join([again], [generation(2, uuids=SWAPPED)], pins=first.pins)
    assert list(fresh.caps) == [UUIDS[1]]
    assert fresh.problems == ()
    assert join([], [generation(1)], pins=first.pins).pins == {}


def test_the_claims_own_config_applies_after_its_classs_whatever_the_listed_order():
    """DRA applies the class's configuration first, then the claim's, later entries of a
    source overriding earlier ones: a FromClass entry listed after the claim's loses."""
    from_class = {**capwatch(power_cap(500)), "source": "FromClass"}
    configs = [capwatch(power_cap(300)), capwatch(power_cap(350)), from_class]
    snapshot = join([claim("c", {"gpu": "gpu-0"}, config=configs)], [slice_of()])
    assert [c.watts for c in snapshot.caps[UUIDS[0]]] == [350]
    only_class = join([claim("c", {"gpu": "gpu-0"}, config=[from_class])], [slice_of()])
    assert [c.watts for c in only_class.caps[UUIDS[0]]] == [500]


def test_a_claim_that_cannot_be_read_is_named_and_holds_its_pods():
    """A claim a pod names that cannot be read (not found, not allocated, a failed GET) is
    a named problem and its pods are held; it asks no cap of any GPU."""
    snapshot = join([], [slice_of()], unread={"gone": "not found"})
    (problem,) = snapshot.problems
    assert (problem.kind, problem.message()) == (
        ClaimProblemKind.UNAVAILABLE,
        "claim ml/gone: not found",
    )
    assert snapshot.hold(["someone-else", POD.uid]) is problem
    assert snapshot.hold(["someone-else"]) is None
    assert snapshot.caps == {}


def pod(name: str, *claims: str, finished: bool = False, namespace: str = "ml") -> PodInfo:
    return PodInfo(
        ref=PodRef(namespace=namespace, name=name, uid=f"uid-{name}"),
        claims=claims,
        finished=finished,
    )


def test_the_claims_read_are_those_the_nodes_running_pods_name():
    """Each claim a running pod of this node names, with the pods naming it (a shared
    claim once); a finished pod's claims are not read (its generated claims are deleted
    with it); the same name in two namespaces is two claims."""
    pods = [pod("a", "shared", "own"), pod("b", "shared"), pod("done", "old", finished=True)]
    pods.append(pod("c", "shared", namespace="other"))
    using = referenced_claims(PodSnapshot(pods={p.ref.uid: p for p in pods}))
    assert {key: [p.name for p in refs] for key, refs in using.items()} == {
        ("ml", "shared"): ["a", "b"],
        ("ml", "own"): ["a"],
        ("other", "shared"): ["c"],
    }


def test_a_pod_names_its_claims_in_its_spec_and_its_template_claims_in_its_status():
    """As the kubelet reads them: ``spec.resourceClaims[].resourceClaimName``, and for a
    template the name ``status.resourceClaimStatuses`` gives once the claim is made (an
    entry without one: none was needed); a Succeeded or Failed pod is finished."""
    obj = {
        "metadata": {"namespace": "ml", "name": "p", "uid": "u"},
        "spec": {
            "resourceClaims": [
                {"name": "shared", "resourceClaimName": "team-gpu"},
                {"name": "mine", "resourceClaimTemplateName": "one-gpu"},
                {"name": "optional", "resourceClaimTemplateName": "maybe"},
            ]
        },
        "status": {
            "phase": "Running",
            "resourceClaimStatuses": [
                {"name": "mine", "resourceClaimName": "p-mine-x7k2q"},
                {"name": "optional"},
            ],
        },
    }
    info = pod_info(obj)
    assert info is not None
    assert (info.claims, info.finished) == (("p-mine-x7k2q", "team-gpu"), False)
    obj["status"]["phase"] = "Succeeded"
    done = pod_info(obj)
    assert done is not None
    assert done.finished


@pytest.mark.parametrize("count", [0, -1, "2"])
def test_a_slice_count_that_is_not_a_positive_number_counts_as_one(count: object):
    """A malformed resourceSliceCount does not make a pool wait forever for slices."""
    item = generation(1)
    item["spec"]["pool"]["resourceSliceCount"] = count
    devices = node_devices([item], node=NODE, uuid_attribute="uuid")
    assert devices.resolve(GPU0) == (UUIDS[0], "")


def test_the_snapshot_is_pure_and_needs_nothing_read():
    """With no claim used, nothing is capped and nothing is a problem, whatever the slices."""
    empty = claims_snapshot([], {}, node_devices([slice_of()], node=NODE, uuid_attribute="uuid"))
    assert (empty.caps, empty.problems, dict(empty.held)) == ({}, (), {})
    assert len(empty.names) == len(UUIDS)
