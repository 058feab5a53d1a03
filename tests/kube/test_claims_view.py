"""The agent's claims view over the real ``kubernetes`` client (agent/kube/claims.py):
list+watch of ResourceClaims and of this node's ResourceSlices, the snapshot the cycle
reads kept current by watch events, no request per steady snapshot, and the probe that
tells a server without resource.k8s.io/v1."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import kubernetes.client
import pytest

from agent.claims import ClaimsSnapshot
from agent.kube.claims import RESOURCE_API, SLICES_PATH, ClaimInformer, claims_path
from agent.kube.client import CollectionRequests, group_version_served
from agent.kube.informer import WatchPolicy
from kit.clock import SystemClock
from kit.errors import PodViewError
from tests.claims_objects import NODE, POD, UUIDS, capwatch, claim, power_cap, slice_of
from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.kube.support import wait_until

ClaimInformerFactory = Callable[..., ClaimInformer]


@pytest.fixture
def make_claims(
    kube_apiserver: FakeKubeApiServer, kube_api_client: kubernetes.client.ApiClient
) -> Iterator[ClaimInformerFactory]:
    views: list[ClaimInformer] = []

    def factory(
        namespace: str | None = None, on_change: Callable[[], None] | None = None
    ) -> ClaimInformer:
        view = ClaimInformer(
            node_name=NODE,
            claims=CollectionRequests(kube_api_client, path=claims_path(namespace)),
            slices=CollectionRequests(
                kube_api_client, path=SLICES_PATH, field_selector=f"spec.nodeName={NODE}"
            ),
            clock=SystemClock(),
            policy=WatchPolicy(stale_after=5, backoff_initial=0.005, backoff_max=0.02),
            rng=random.Random(3),
            on_change=on_change,
        )
        views.append(view)
        view.start()
        return view

    yield factory
    for view in views:
        view.close()


def synced(view: ClaimInformer) -> ClaimsSnapshot | None:
    try:
        return view.snapshot()
    except PodViewError:
        return None


def capped(view: ClaimInformer) -> dict[str, list[int | None]]:
    snapshot = synced(view)
    if snapshot is None:
        return {}
    return {uuid: [c.watts for c in caps] for uuid, caps in snapshot.caps.items()}


def test_the_view_follows_claims_and_this_nodes_slices_from_watch_events(
    kube_apiserver: FakeKubeApiServer, make_claims
):
    """After one LIST of each, a claim allocated later, its change and its deletion all
    reach the snapshot by WATCH; another node's slice is never listed."""
    kube_apiserver.put_slice(slice_of())
    kube_apiserver.put_slice(slice_of("other-node"))
    view = make_claims()
    wait_until(lambda: synced(view) is not None, what="claims view synced")
    assert view.snapshot().names.keys() == set(UUIDS)
    kube_apiserver.put_claim(claim("c", {"gpu": "gpu-1"}, config=[capwatch(power_cap(400))]))
    wait_until(lambda: capped(view) == {UUIDS[1]: [400]}, what="claim seen")
    kube_apiserver.put_claim(claim("c", {"gpu": "gpu-1"}, config=[capwatch(power_cap(350))]))
    wait_until(lambda: capped(view) == {UUIDS[1]: [350]}, what="claim change seen")
    kube_apiserver.delete_claim("ml", "c")
    wait_until(lambda: capped(view) == {}, what="claim deletion seen")
    slices = kube_apiserver.requests("slice_list")
    assert all(r.query.get("fieldSelector") == f"spec.nodeName={NODE}" for r in slices)


def test_a_steady_snapshot_costs_no_request(kube_apiserver: FakeKubeApiServer, make_claims):
    """Once synced, a thousand snapshots (a thousand cycles) send nothing to the server:
    no LIST, no new WATCH."""
    kube_apiserver.put_slice(slice_of())
    kube_apiserver.put_claim(claim("c", {"gpu": "gpu-0"}, config=[capwatch(power_cap(400))]))
    view = make_claims()
    wait_until(lambda: capped(view) == {UUIDS[0]: [400]}, what="claims view synced")
    kinds = ("claim_list", "claim_watch", "slice_list", "slice_watch")
    before = {kind: kube_apiserver.count(kind) for kind in kinds}
    for _ in range(1000):
        assert view.snapshot().for_gpu(UUIDS[0], {POD.uid: object()})
    assert {kind: kube_apiserver.count(kind) for kind in kinds} == before


def test_an_unallocated_claim_is_not_kept(kube_apiserver: FakeKubeApiServer, make_claims):
    """A claim without status.allocation asks nothing; when the scheduler allocates it
    (a MODIFIED event), it does."""
    kube_apiserver.put_slice(slice_of())
    pending = claim("c", {"gpu": "gpu-2"}, config=[capwatch(power_cap(300))])
    status = pending.pop("status")
    kube_apiserver.put_claim(pending)
    view = make_claims()
    wait_until(lambda: synced(view) is not None, what="claims view synced")
    assert capped(view) == {}
    kube_apiserver.put_claim({**pending, "status": status})
    wait_until(lambda: capped(view) == {UUIDS[2]: [300]}, what="allocation seen")


def test_a_namespaced_view_lists_claims_of_its_namespace_only(
    kube_apiserver: FakeKubeApiServer, make_claims
):
    """With a namespaced Role the claims come from the release namespace's collection."""
    kube_apiserver.put_slice(slice_of())
    view = make_claims("capwatch")
    wait_until(lambda: synced(view) is not None, what="claims view synced")
    (listed,) = kube_apiserver.requests("claim_list")
    assert listed.path == "/apis/resource.k8s.io/v1/namespaces/capwatch/resourceclaims"


def test_the_probe_tells_a_server_with_and_without_resource_api(
    kube_api_client: kubernetes.client.ApiClient,
):
    """group_version_served: True where resource.k8s.io/v1 is served, False on a server
    that answers 404 (before 1.34), None when the server cannot be reached."""
    assert group_version_served(kube_api_client, RESOURCE_API, timeout=5) is True
    old = FakeKubeApiServer(resource_api=False)
    old.start()
    try:
        config = kubernetes.client.Configuration(host=old.url)
        config.retries = False
        with kubernetes.client.ApiClient(config) as client:
            assert group_version_served(client, RESOURCE_API, timeout=5) is False
    finally:
        old.stop()
    config = kubernetes.client.Configuration(host=old.url)  # stopped: refused
    config.retries = False
    with kubernetes.client.ApiClient(config) as client:
        assert group_version_served(client, RESOURCE_API, timeout=5) is None


def test_a_change_on_this_node_nudges_the_agent_and_another_nodes_does_not(
    kube_apiserver: FakeKubeApiServer, make_claims
):
    """on_change (the agent's nudge toward an early cycle) hears of a claim allocated in
    a pool of this node and of its deallocation, not of claims allocated elsewhere."""
    kube_apiserver.put_slice(slice_of())
    told: list[str] = []
    view = make_claims(on_change=lambda: told.append("changed"))
    wait_until(lambda: synced(view) is not None, what="claims view synced")
    told.clear()
    kube_apiserver.put_claim(
        claim("elsewhere", {"gpu": "gpu-0"}, pool="other-node", config=[capwatch(power_cap(1))])
    )
    here = claim("here", {"gpu": "gpu-0"}, config=[capwatch(power_cap(400))])
    kube_apiserver.put_claim(here)
    wait_until(lambda: capped(view) == {UUIDS[0]: [400]}, what="claim seen")
    assert told == ["changed"]
    here["status"].pop("allocation")
    kube_apiserver.put_claim(here)
    wait_until(lambda: capped(view) == {}, what="deallocation seen")
    assert told == ["changed", "changed"]
