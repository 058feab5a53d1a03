"""The fake API server's ``coordination.k8s.io/v1`` Leases: create, get, list and update
with real optimistic concurrency, body checks, faults, the write log and lease states."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.kube.conftest import ClientFactory
from tests.kube.rawapi import call

LEASES = "/apis/coordination.k8s.io/v1/namespaces/capwatch/leases"
T0 = "2025-03-01T10:00:00.000000Z"
T1 = "2025-03-01T10:00:02.000000Z"


def _lease(name: str, holder: str, *, rv: str = "", renew: str = T0, **spec: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": "capwatch"}
    if rv:
        metadata["resourceVersion"] = rv
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 15,
            "acquireTime": T0,
            "renewTime": renew,
            "leaseTransitions": 0,
            **spec,
        },
    }


def test_create_get_update_with_optimistic_concurrency(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """POST creates (201) and a second POST of the name is 409 AlreadyExists; GET answers
    the Lease with its spec as sent; PUT at the current resourceVersion succeeds and bumps
    it; PUT at a stale one is 409 Conflict; PUT of a missing Lease is 404; GET of a
    missing one is 404."""
    a, b = make_client("capwatch-controller/a"), make_client("capwatch-controller/b")
    created = call(a, "POST", LEASES, body=_lease("shard-0", "a"))
    assert created.status == 201
    assert (created.body["kind"], created.body["apiVersion"]) == ("Lease", "coordination.k8s.io/v1")
    assert created.body["spec"] == _lease("shard-0", "a")["spec"]
    assert created.body["metadata"]["uid"]
    again = call(b, "POST", LEASES, body=_lease("shard-0", "b"))
    assert (again.status, again.reason) == (409, "AlreadyExists")

    got = call(b, "GET", f"{LEASES}/shard-0")
    assert got.body == created.body
    renewed = call(a, "PUT", f"{LEASES}/shard-0", body=_lease("shard-0", "a", rv=got.rv, renew=T1))
    assert renewed.status == 200
    assert int(renewed.rv) > int(got.rv)
    assert renewed.body["spec"]["renewTime"] == T1
    assert renewed.body["metadata"]["uid"] == created.body["metadata"]["uid"]

    stale = call(b, "PUT", f"{LEASES}/shard-0", body=_lease("shard-0", "b", rv=got.rv))
    assert (stale.status, stale.reason) == (409, "Conflict")
    assert "the object has been modified" in stale.body["message"]
    lease = kube_apiserver.lease("capwatch", "shard-0")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "a"

    missing = call(a, "PUT", f"{LEASES}/gone", body=_lease("gone", "a", rv="5"))
    assert (missing.status, missing.reason) == (404, "NotFound")
    assert call(a, "GET", f"{LEASES}/gone").status == 404
    assert kube_apiserver.lease("capwatch", "gone") is None


def test_spec_is_kept_as_sent_nulls_left_out(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """holderIdentity (even ""), leaseDurationSeconds, acquireTime, renewTime and
    leaseTransitions are stored as sent; null fields and unknown spec fields are left
    out; a PUT without resourceVersion is an unconditional update."""
    client = make_client("t")
    call(client, "POST", LEASES, body=_lease("l", "a", acquireTime=None, bogus=1))
    lease = kube_apiserver.lease("capwatch", "l")
    assert lease is not None
    assert lease["spec"] == {
        "holderIdentity": "a",
        "leaseDurationSeconds": 15,
        "renewTime": T0,
        "leaseTransitions": 0,
    }
    released = call(
        client,
        "PUT",
        f"{LEASES}/l",
        body=_lease("l", "", leaseDurationSeconds=1, leaseTransitions=3),
    )
    assert released.status == 200
    assert released.body["spec"]["holderIdentity"] == ""
    assert (
        released.body["spec"]["leaseDurationSeconds"],
        released.body["spec"]["leaseTransitions"],
    ) == (1, 3)


@pytest.mark.parametrize(
    ("method", "body", "status", "reason"),
    [
        ("POST", _lease("l", "a", renewTime="2025-03-01T10:00:00Z"), 400, "BadRequest"),
        ("POST", _lease("l", "a", acquireTime="2025-03-01T10:00:00.1234567Z"), 400, "BadRequest"),
        ("POST", _lease("l", "a", leaseDurationSeconds="15"), 400, "BadRequest"),
        ("POST", _lease("l", "a", leaseDurationSeconds=0), 422, "Invalid"),
        ("POST", _lease("l", "a", leaseTransitions=-1), 422, "Invalid"),
        ("POST", _lease("l", "a", rv="7"), 500, "InternalError"),
        ("POST", {**_lease("l", "a"), "metadata": {"namespace": "capwatch"}}, 422, "Invalid"),
        (
            "POST",
            {**_lease("l", "a"), "metadata": {"name": "l", "namespace": "x"}},
            400,
            "BadRequest",
        ),
        ("PUT", _lease("other", "a"), 400, "BadRequest"),  # name differs from the URL's
    ],
)
def test_bodies_are_checked_as_the_real_server_checks_them(
    kube_apiserver: FakeKubeApiServer,
    make_client: ClientFactory,
    method: str,
    body: dict[str, Any],
    status: int,
    reason: str,
) -> None:
    """MicroTime needs exactly six fractional digits; wrong JSON types are 400; a
    non-positive duration or negative transition count 422; a resourceVersion on create
    500; a missing name 422; a namespace or name at odds with the URL 400. Nothing is
    written."""
    client = make_client("t")
    if method == "PUT":
        kube_apiserver.add_lease("capwatch", "l", holder="a")
    before = kube_apiserver.lease("capwatch", "l")
    path = LEASES if method == "POST" else f"{LEASES}/l"
    answer = call(client, method, path, body=body)
    assert (answer.status, answer.reason) == (status, reason)
    assert kube_apiserver.lease("capwatch", "l") == before


def test_list_leases_in_a_namespace(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """GET of the collection is a LeaseList of that namespace's Leases only."""
    kube_apiserver.add_lease("capwatch", "shard-1", holder="x")
    kube_apiserver.add_lease("capwatch", "shard-0", holder="y")
    kube_apiserver.add_lease("other", "shard-0", holder="z")
    answer = call(make_client("t"), "GET", LEASES)
    assert answer.body["kind"] == "LeaseList"
    assert [i["metadata"]["name"] for i in answer.body["items"]] == ["shard-0", "shard-1"]
    assert [i["spec"]["holderIdentity"] for i in answer.body["items"]] == ["y", "x"]


def test_write_log_and_lease_states(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """Each successful create/update is logged with server time, method, User-Agent and
    holder; refused writes are not. lease_states() has each Lease's holder and the time
    of its last successful write, which moves even for a write that changes nothing
    (the client's renewal did succeed) while the resourceVersion stays."""
    a, b = make_client("capwatch-controller/a"), make_client("capwatch-controller/b")
    created = call(a, "POST", LEASES, body=_lease("shard-0", "a"))
    call(b, "PUT", f"{LEASES}/shard-0", body=_lease("shard-0", "b", rv="1"))  # stale: refused
    same = call(a, "PUT", f"{LEASES}/shard-0", body=_lease("shard-0", "a", rv=created.rv))
    assert same.rv == created.rv  # nothing changed, nothing written
    writes = kube_apiserver.lease_writes()
    assert [(w.method, w.user_agent, w.holder) for w in writes] == [
        ("POST", "capwatch-controller/a", "a"),
        ("PUT", "capwatch-controller/a", "a"),
    ]
    assert writes[0].at <= writes[1].at
    state = kube_apiserver.lease_states()[("capwatch", "shard-0")]
    assert (state.holder, state.renewed_at, state.renewed_by, state.resource_version) == (
        "a",
        writes[1].at,
        "capwatch-controller/a",
        created.rv,
    )
    assert state.lease_duration_s == 15
    assert kube_apiserver.lease_writes("capwatch", "absent") == []


def test_lease_faults_by_method(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """fail_next("lease", ..., method="PUT") fails the renewal, not the read before it;
    a 429 carries Retry-After; the refused PUT writes nothing."""
    kube_apiserver.add_lease("capwatch", "shard-0", holder="a")
    kube_apiserver.fail_next("lease", 429, retry_after=1, method="PUT")
    kube_apiserver.fail_next("lease", 500, method="PUT")
    client = make_client("capwatch-controller/a")
    got = call(client, "GET", f"{LEASES}/shard-0")
    assert got.status == 200
    body = _lease("shard-0", "a", rv=got.rv, renew=T1)
    throttled = call(client, "PUT", f"{LEASES}/shard-0", body=body)
    assert (throttled.status, throttled.headers["Retry-After"]) == (429, "1")
    assert call(client, "PUT", f"{LEASES}/shard-0", body=body).status == 500
    assert call(client, "PUT", f"{LEASES}/shard-0", body=body).status == 200
    assert [r.method for r in kube_apiserver.requests("lease")] == ["GET", "PUT", "PUT", "PUT"]
    assert [w.method for w in kube_apiserver.lease_writes()] == ["POST", "PUT"]


def test_unmodelled_methods_and_paths_say_so(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """DELETE or PATCH of a Lease (not modelled) answer 405 MethodNotAllowed, a path the
    fake does not serve 404, each with a Status body and without touching the Lease."""
    kube_apiserver.add_lease("capwatch", "l", holder="a")
    before = kube_apiserver.lease("capwatch", "l")
    client = make_client("t")
    deleted = call(client, "DELETE", f"{LEASES}/l")
    patched = call(
        client, "PATCH", f"{LEASES}/l", body={}, content_type="application/merge-patch+json"
    )
    unknown = call(client, "GET", "/api/v1/namespaces/capwatch/configmaps")
    assert (deleted.status, deleted.reason) == (405, "MethodNotAllowed")
    assert (patched.status, patched.reason) == (405, "MethodNotAllowed")
    assert (unknown.status, unknown.reason) == (404, "NotFound")
    assert kube_apiserver.lease("capwatch", "l") == before
    assert kube_apiserver.requests() == []  # neither is logged
