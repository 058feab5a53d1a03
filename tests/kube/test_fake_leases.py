"""The fake API server's ``coordination.k8s.io/v1`` Leases: create, get, list and update
with real optimistic concurrency and body checks, on the fake and on a real
kube-apiserver (``apiserver``); faults, the write log and lease states are the fake's
alone (tests taking ``kube_apiserver``)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.kube.conftest import ClientFactory
from tests.kube.rawapi import call
from tests.kube.servers import ApiServer

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


def test_create_get_update_with_optimistic_concurrency(apiserver: ApiServer) -> None:
    """POST creates (201) and a second POST of the name is 409 AlreadyExists; GET answers
    the Lease with its spec as sent; PUT at the current resourceVersion succeeds and bumps
    it; PUT at a stale one is 409 Conflict; PUT without one is 422 (a Lease takes no
    unconditional update); GET of a missing one is 404."""
    a = apiserver.client("capwatch-controller/a")
    b = apiserver.client("capwatch-controller/b")
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
    blind = call(b, "PUT", f"{LEASES}/shard-0", body=_lease("shard-0", "b"))
    assert (blind.status, blind.reason) == (422, "Invalid")
    assert "metadata.resourceVersion" in blind.body["message"]
    lease = apiserver.lease("capwatch", "shard-0")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "a"
    assert call(a, "GET", f"{LEASES}/gone").status == 404
    assert apiserver.lease("capwatch", "gone") is None


def test_put_of_a_missing_lease_creates_it(apiserver: ApiServer) -> None:
    """Leases allow create on update: a PUT of a Lease that does not exist answers 201
    with it created, whatever resourceVersion the body names; a later PUT at the stale
    version the caller had is then a 409."""
    client = apiserver.client("capwatch-controller/a")
    put = call(client, "PUT", f"{LEASES}/gone", body=_lease("gone", "a", rv="5"))
    assert put.status == 201
    assert put.body["spec"]["holderIdentity"] == "a"
    assert put.rv != "5"
    lease = apiserver.lease("capwatch", "gone")
    assert lease is not None
    assert lease["metadata"]["uid"] == put.body["metadata"]["uid"]
    stale = call(client, "PUT", f"{LEASES}/gone", body=_lease("gone", "b", rv="5"))
    assert (stale.status, stale.reason) == (409, "Conflict")


def test_a_uid_in_the_body_is_a_precondition(apiserver: ApiServer) -> None:
    """A PUT carrying the uid of the Lease it read succeeds while that Lease is there;
    once it is gone, or for another Lease's uid, it is 409 Conflict and creates
    nothing; without a uid the same PUT creates it."""
    client = apiserver.client("capwatch-controller/a")
    created = call(client, "POST", LEASES, body=_lease("shard-0", "a"))
    read = created.body
    renew = {**read, "spec": {**read["spec"], "renewTime": T1}}
    assert call(client, "PUT", f"{LEASES}/shard-0", body=renew).status == 200
    other = {**renew, "metadata": {**renew["metadata"], "name": "shard-1"}}
    refused = call(client, "PUT", f"{LEASES}/shard-1", body=other)
    assert (refused.status, refused.reason) == (409, "Conflict")
    assert "Precondition failed: UID" in refused.body["message"]
    assert apiserver.lease("capwatch", "shard-1") is None
    unread = {**other, "metadata": {"name": "shard-1", "resourceVersion": created.rv}}
    assert call(client, "PUT", f"{LEASES}/shard-1", body=unread).status == 201


def test_metadata_and_spec_fields_kept_or_dropped(apiserver: ApiServer) -> None:
    """Labels, annotations, owner references and finalizers are kept as sent; the
    coordinated leader election fields (strategy, preferredHolder) are dropped without
    a warning, as a 1.37 server without that feature gate drops them."""
    metadata = {
        "name": "l",
        "labels": {"a": "b"},
        "annotations": {"x": "y"},
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "name": "cm",
                "uid": "11111111-1111-1111-1111-111111111111",
            }
        ],
    }
    body = {
        **_lease("l", "a", preferredHolder="b", strategy="OldestEmulationVersion"),
        "metadata": metadata,
    }
    answer = call(apiserver.client(), "POST", LEASES, body=body)
    assert answer.status == 201
    assert "Warning" not in answer.headers
    kept = {k: answer.body["metadata"][k] for k in ("labels", "annotations", "ownerReferences")}
    assert kept == {k: v for k, v in metadata.items() if k != "name"}
    assert answer.body["spec"] == _lease("l", "a")["spec"]


def test_spec_is_kept_as_sent_nulls_left_out(apiserver: ApiServer) -> None:
    """holderIdentity (even ""), leaseDurationSeconds, acquireTime, renewTime and
    leaseTransitions are stored as sent; null fields are left out; unknown spec fields
    are dropped, with a Warning header naming each."""
    client = apiserver.client()
    created = call(client, "POST", LEASES, body=_lease("l", "a", acquireTime=None, bogus=1))
    assert created.status == 201
    assert created.headers["Warning"] == '299 - "unknown field \\"spec.bogus\\""'
    lease = apiserver.lease("capwatch", "l")
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
        body=_lease("l", "", rv=created.rv, leaseDurationSeconds=1, leaseTransitions=3),
    )
    assert released.status == 200
    assert "Warning" not in released.headers
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
        ("POST", _lease("l", "a", acquireTime="2025-03-01T10:00:00.123Z"), 400, "BadRequest"),
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
        ("PUT", _lease("l", "b"), 422, "Invalid"),  # no resourceVersion
    ],
)
def test_bodies_are_checked_as_the_real_server_checks_them(
    apiserver: ApiServer, method: str, body: dict[str, Any], status: int, reason: str
) -> None:
    """MicroTime needs exactly six fractional digits; wrong JSON types are 400; a
    non-positive duration or negative transition count 422; a resourceVersion on create
    500; a missing name 422; a namespace or name at odds with the URL 400; an update
    without a resourceVersion 422. Nothing is written."""
    if method == "PUT":
        apiserver.add_lease("capwatch", "l", holder="a")
    before = apiserver.lease("capwatch", "l")
    path = LEASES if method == "POST" else f"{LEASES}/l"
    answer = call(apiserver.client(), method, path, body=body)
    assert (answer.status, answer.body.get("reason", "InternalError")) == (status, reason)
    assert apiserver.lease("capwatch", "l") == before


def test_times_are_stored_in_utc(apiserver: ApiServer) -> None:
    """A MicroTime with an offset is stored as the same instant in UTC."""
    body = _lease("l", "a", renewTime="2025-03-01T12:00:02.500000+02:00")
    answer = call(apiserver.client(), "POST", LEASES, body=body)
    assert answer.body["spec"]["renewTime"] == "2025-03-01T10:00:02.500000Z"


def test_list_leases_in_a_namespace(apiserver: ApiServer) -> None:
    """GET of the collection is a LeaseList of that namespace's Leases only, by name."""
    apiserver.add_lease("capwatch", "shard-1", holder="x")
    apiserver.add_lease("capwatch", "shard-0", holder="y")
    apiserver.add_lease("other", "shard-0", holder="z")
    answer = call(apiserver.client(), "GET", LEASES)
    assert answer.body["kind"] == "LeaseList"
    assert [i["metadata"]["name"] for i in answer.body["items"]] == ["shard-0", "shard-1"]
    assert [i["spec"]["holderIdentity"] for i in answer.body["items"]] == ["y", "x"]
    assert all("kind" not in i for i in answer.body["items"])


def test_write_log_and_lease_states(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """The write log that proves fencing (the fake's alone). Each successful
    create/update is logged with server time, method, User-Agent and holder; refused
    writes are not. lease_states() has each Lease's holder and the time
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
    """Fault injection: the real server cannot do this on demand.
    fail_next("lease", ..., method="PUT") fails the renewal, not the read before it;
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
    """The fake's own honesty about what it does not model (a real server serves both):
    DELETE or PATCH of a Lease answer 405 MethodNotAllowed, a path the fake does not
    serve 404, each with a Status body and without touching the Lease."""
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
