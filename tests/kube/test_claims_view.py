"""The agent's claims view over capwatch's transport (agent/kube/claims.py): the
claims this node's pods name, read by name and kept; this node's ResourceSlices by
list+watch; no request per steady snapshot; never a list of claims; resource.k8s.io/v1
appearing and disappearing while the agent runs; and the probe that tells it served."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import pytest

from capwatch.agent.dra.claims import ClaimProblemKind, ClaimsSnapshot
from capwatch.agent.kube.claims import RESOURCE_API, SLICES_PATH, NodeClaims
from capwatch.agent.pods import PodInfo, PodRef, PodSnapshot
from capwatch.kit.clock import SystemClock
from capwatch.kit.errors import PodViewError
from capwatch.kube.client import CollectionRequests, ObjectRequests, group_version_served
from capwatch.kube.informer import WatchPolicy
from capwatch.kube.transport import ApiTransport
from tests.claims_objects import NODE, POD, UUIDS, capwatch, claim, power_cap, slice_of
from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.kube.rawapi import client_for
from tests.kube.support import wait_until

ViewFactory = Callable[..., NodeClaims]
OTHER = PodRef(namespace="ml", name="train-1", uid="pod-uid-1")


def pods(*using: tuple[PodRef, tuple[str, ...]]) -> PodSnapshot:
    """This node's pods, each naming its claims."""
    return PodSnapshot(pods={ref.uid: PodInfo(ref=ref, claims=names) for ref, names in using})


@pytest.fixture
def make_claims(
    kube_apiserver: FakeKubeApiServer, kube_api_client: ApiTransport
) -> Iterator[ViewFactory]:
    views: list[NodeClaims] = []

    def factory(on_change: Callable[[], None] | None = None, recheck_s: float = 60.0) -> NodeClaims:
        view = NodeClaims(
            node_name=NODE,
            slices=CollectionRequests(
                kube_api_client, path=SLICES_PATH, field_selector=f"spec.nodeName={NODE}"
            ),
            objects=ObjectRequests(kube_api_client, timeout=5.0),
            served=lambda: group_version_served(kube_api_client, RESOURCE_API, timeout=5),
            clock=SystemClock(),
            policy=WatchPolicy(stale_after=5, backoff_initial=0.005, backoff_max=0.02),
            rng=random.Random(3),
            on_change=on_change,
            recheck_s=recheck_s,
        )
        views.append(view)
        view.start()
        return view

    yield factory
    for view in views:
        view.close()


def synced(view: NodeClaims, snapshot: PodSnapshot) -> ClaimsSnapshot | None:
    try:
        return view.snapshot(snapshot)
    except PodViewError:
        return None


def capped(view: NodeClaims, snapshot: PodSnapshot) -> dict[str, list[int | None]]:
    found = synced(view, snapshot)
    if found is None:
        return {}
    return {uuid: [c.watts for c in caps] for uuid, caps in found.caps.items()}


def test_claims_are_read_by_name_when_a_pod_names_them_and_never_listed(
    kube_apiserver: FakeKubeApiServer, make_claims
):
    """A claim is one GET when this node's pod first names it; claims no pod here names
    (another node's) are never read; no claim is ever listed or watched, and the slices
    are listed and watched with this node's field selector only."""
    kube_apiserver.put_slice(slice_of())
    kube_apiserver.put_slice(slice_of("other-node"))
    kube_apiserver.put_claim(claim("mine", {"gpu": "gpu-1"}, config=[capwatch(power_cap(400))]))
    for i in range(50):
        kube_apiserver.put_claim(claim(f"theirs-{i}", {"gpu": "gpu-0"}, pool="other-node"))
    view = make_claims()
    none = pods()
    wait_until(lambda: synced(view, none) is not None, what="slices synced")
    assert view.snapshot(none).names.keys() == set(UUIDS)
    using = pods((POD, ("mine",)))
    assert capped(view, using) == {UUIDS[1]: [400]}
    (got,) = kube_apiserver.requests("claim_get")
    assert got.path == "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/mine"
    assert kube_apiserver.count("claim_list") == kube_apiserver.count("claim_watch") == 0
    slices = kube_apiserver.requests("slice_list") + kube_apiserver.requests("slice_watch")
    assert all(r.query.get("fieldSelector") == f"spec.nodeName={NODE}" for r in slices)


def test_a_steady_snapshot_costs_no_request(kube_apiserver: FakeKubeApiServer, make_claims):
    """Once read, a thousand snapshots (a thousand cycles) send nothing to the server: no
    GET, no LIST, no new WATCH."""
    kube_apiserver.put_slice(slice_of())
    kube_apiserver.put_claim(claim("c", {"gpu": "gpu-0"}, config=[capwatch(power_cap(400))]))
    view = make_claims()
    using = pods((POD, ("c",)))
    wait_until(lambda: capped(view, using) == {UUIDS[0]: [400]}, what="claim read")
    kinds = ("claim_get", "slice_list", "slice_watch")
    before = {kind: kube_apiserver.count(kind) for kind in kinds}
    for _ in range(1000):
        assert view.snapshot(using).for_gpu(UUIDS[0])
    assert {kind: kube_apiserver.count(kind) for kind in kinds} == before
    assert view.requests == 1


def test_a_claim_is_read_again_for_a_new_pod_and_forgotten_with_its_last(
    kube_apiserver: FakeKubeApiServer, make_claims
):
    """A second pod naming a shared claim reads it again (its allocation may be new); once
    no pod of this node names it, it is forgotten, and naming it again reads it afresh."""
    kube_apiserver.put_slice(slice_of())
    kube_apiserver.put_claim(claim("c", {"gpu": "gpu-0"}, config=[capwatch(power_cap(400))]))
    view = make_claims()
    one = pods((POD, ("c",)))
    wait_until(lambda: capped(view, one) == {UUIDS[0]: [400]}, what="claim read")
    view.snapshot(pods((POD, ("c",)), (OTHER, ("c",))))
    view.snapshot(pods((OTHER, ("c",))))
    assert view.requests == 2
    view.snapshot(pods())
    view.snapshot(one)
    assert view.requests == 3


def test_a_claim_that_cannot_be_read_is_named_and_read_again_next_cycle(
    kube_apiserver: FakeKubeApiServer, make_claims
):
    """Not found, not allocated yet, or a failed GET: a named problem holding the pod's
    GPUs, and the next snapshot asks again (none is cached)."""
    kube_apiserver.put_slice(slice_of())
    view = make_claims()
    using = pods((POD, ("c",)))
    wait_until(lambda: synced(view, pods()) is not None, what="slices synced")
    (problem,) = view.snapshot(using).problems
    assert (problem.kind, problem.detail) == (ClaimProblemKind.UNAVAILABLE, "not found")
    pending = claim("c", {"gpu": "gpu-2"}, config=[capwatch(power_cap(300))])
    status = pending.pop("status")
    kube_apiserver.put_claim(pending)
    (problem,) = view.snapshot(using).problems
    assert problem.detail == "not allocated"
    kube_apiserver.put_claim({**pending, "status": status})
    kube_apiserver.fail_next("claim_get", 500)
    (problem,) = view.snapshot(using).problems
    assert problem.detail.startswith("cannot be read: HTTP 500")
    assert capped(view, using) == {UUIDS[2]: [300]}
    assert view.requests == 4


def test_resource_api_appearing_and_going_while_the_agent_runs(
    kube_apiserver: FakeKubeApiServer, make_claims
):
    """Not served at start: no slice is watched and a claim a pod names is a named
    problem (nothing crashes); once served, the next check starts the slices' watch and
    claims are read; when the group goes again, the view says so, watches nothing, and
    the claim already read keeps its cap on its GPU, the missing slice named."""
    kube_apiserver.put_slice(slice_of())
    kube_apiserver.put_claim(claim("c", {"gpu": "gpu-0"}, config=[capwatch(power_cap(400))]))
    kube_apiserver.serve_resource_api(False)
    view = make_claims(recheck_s=0.05)
    using = pods((POD, ("c",)))
    assert not view.served
    (problem,) = view.snapshot(using).problems
    assert problem.detail == f"{RESOURCE_API} is not served"
    assert kube_apiserver.count("slice_list") == 0
    kube_apiserver.serve_resource_api(True)
    wait_until(lambda: capped(view, using) == {UUIDS[0]: [400]}, what="claims read once served")
    assert view.served
    kube_apiserver.serve_resource_api(False)
    wait_until(lambda: synced(view, using) is not None and not view.served, what="gone seen")
    gone = view.snapshot(using)
    (problem,) = gone.problems
    assert (problem.kind, problem.kept_on) == (ClaimProblemKind.UNMAPPED, UUIDS[0])
    assert capped(view, using) == {UUIDS[0]: [400]}


def test_the_probe_tells_a_server_with_and_without_resource_api(
    kube_api_client: ApiTransport,
):
    """group_version_served: True where resource.k8s.io/v1 is served, False on a server
    that answers 404 (before 1.34), None when the server cannot be reached."""
    assert group_version_served(kube_api_client, RESOURCE_API, timeout=5) is True
    old = FakeKubeApiServer(resource_api=False)
    old.start()
    try:
        client = client_for(old, user_agent="test")
        assert group_version_served(client, RESOURCE_API, timeout=5) is False
        client.close()
    finally:
        old.stop()
    refused = client_for(old, user_agent="test")  # a new connection to a stopped server
    assert group_version_served(refused, RESOURCE_API, timeout=5) is None
    refused.close()


def test_a_change_of_this_nodes_slices_nudges_the_agent(
    kube_apiserver: FakeKubeApiServer, make_claims
):
    """on_change (the agent's nudge toward an early cycle) hears of this node's slices
    changing, not of another node's."""
    kube_apiserver.put_slice(slice_of())
    told: list[str] = []
    view = make_claims(on_change=lambda: told.append("changed"))
    wait_until(lambda: synced(view, pods()) is not None, what="slices synced")
    told.clear()
    kube_apiserver.put_slice(slice_of("other-node"))
    republished = slice_of()
    republished["spec"]["pool"]["generation"] = 2
    kube_apiserver.put_slice(republished)
    wait_until(lambda: told == ["changed"], what="this node's change heard")
