"""The fake API server's ``PATCH /api/v1/nodes/{name}/status``: strategic merge of
conditions by type (ordered as the real server orders them), JSON merge, JSON patch,
the refusals and watches, on the fake and on a real kube-apiserver (``apiserver``);
faults and the write log are the fake's alone (tests taking ``kube_apiserver``)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.kube.conftest import ClientFactory
from tests.kube.rawapi import JSON_PATCH, MERGE_PATCH, SMP, Watch, call, raw_request
from tests.kube.servers import ApiServer

STATUS = "/api/v1/nodes/n1/status"
KUBELET_READY = {
    "type": "Ready",
    "status": "True",
    "reason": "KubeletReady",
    "message": "kubelet is posting ready status",
    "lastHeartbeatTime": "2025-03-01T10:00:00Z",
    "lastTransitionTime": "2025-03-01T09:00:00Z",
}
ENFORCED = {
    "type": "GPUPowerCapEnforced",
    "status": "True",
    "reason": "CapsEnforced",
    "message": "8 GPUs capped",
    "lastTransitionTime": "2025-03-01T10:00:00Z",
    "lastHeartbeatTime": "2025-03-01T10:00:00Z",
}


def _conditions(server: ApiServer | FakeKubeApiServer) -> list[dict[str, str]]:
    node = server.node("n1")
    assert node is not None
    return list(node["status"].get("conditions", []))


def _types(server: ApiServer) -> list[str]:
    return [c["type"] for c in _conditions(server)]


def _patch(server: ApiServer, body: object, content_type: str = SMP) -> Any:
    return call(server.client(), "PATCH", STATUS, body=body, content_type=content_type)


@pytest.fixture
def node(apiserver: ApiServer) -> None:
    apiserver.add_node("n1", conditions=[KUBELET_READY])


@pytest.fixture
def fake_node(kube_apiserver: FakeKubeApiServer) -> None:
    kube_apiserver.add_node("n1", conditions=[KUBELET_READY])


@pytest.mark.usefixtures("node")
def test_strategic_merge_merges_conditions_by_type(apiserver: ApiServer) -> None:
    """A condition of a new type is added, ahead of the others (the real server's
    order: the patch's elements before the server-only ones they cannot be placed
    after); a second patch of that type replaces only the fields it gives, in place;
    other conditions (the kubelet's Ready) are untouched; each write answers the Node,
    bumps its resourceVersion and shows on a watch as MODIFIED."""
    start = apiserver.resource_version()
    first = _patch(apiserver, {"status": {"conditions": [ENFORCED]}})
    assert first.status == 200
    assert first.body["kind"] == "Node"
    assert first.body["status"]["conditions"] == [ENFORCED, KUBELET_READY]
    assert int(first.rv) > int(start)

    heartbeat = {"type": "GPUPowerCapEnforced", "lastHeartbeatTime": "2025-03-01T10:05:00Z"}
    second = _patch(apiserver, {"status": {"conditions": [heartbeat]}})
    assert int(second.rv) > int(first.rv)
    assert _conditions(apiserver) == [
        {**ENFORCED, "lastHeartbeatTime": "2025-03-01T10:05:00Z"},
        KUBELET_READY,
    ]
    watch = Watch(apiserver.client(), "/api/v1/nodes", {"resourceVersion": start})
    try:
        events = [watch.next() for _ in range(2)]
    finally:
        watch.close()
    assert [(e["type"], e["object"]["metadata"]["resourceVersion"]) for e in events] == [
        ("MODIFIED", first.rv),
        ("MODIFIED", second.rv),
    ]


@pytest.mark.parametrize(
    ("live", "patch", "expected"),
    [
        (["A", "B", "C"], ["D", "B"], ["D", "A", "B", "C"]),
        (["A", "B", "C"], ["C", "A"], ["B", "C", "A"]),
        (["Ready", "X"], ["X"], ["Ready", "X"]),
    ],
)
def test_merged_conditions_are_ordered_as_the_real_server_orders_them(
    apiserver: ApiServer, live: list[str], patch: list[str], expected: list[str]
) -> None:
    """strategicpatch's order: the patch's elements in the patch's order, each
    server-only element before the first patch element that follows it in the live
    list; an element new to the list goes before the server-only ones."""
    apiserver.add_node("n1", conditions=[{"type": t, "status": "True"} for t in live])
    conditions = [{"type": t, "status": "False"} for t in patch]
    assert _patch(apiserver, {"status": {"conditions": conditions}}).status == 200
    assert _types(apiserver) == expected


@pytest.mark.usefixtures("node")
def test_strategic_merge_delete_directive_removes_one_condition(apiserver: ApiServer) -> None:
    """``{"type": X, "$patch": "delete"}`` removes that condition and no other; deleting
    one that is not there changes nothing: 200, same resourceVersion, no watch event
    (as the real storage skips a no-op write)."""
    _patch(apiserver, {"status": {"conditions": [ENFORCED]}})
    delete = {"status": {"conditions": [{"type": "GPUPowerCapEnforced", "$patch": "delete"}]}}
    removed = _patch(apiserver, delete)
    assert removed.status == 200
    assert _conditions(apiserver) == [KUBELET_READY]
    after = apiserver.resource_version()
    again = _patch(apiserver, delete)
    assert again.status == 200
    assert again.rv == removed.rv
    apiserver.add_node("marker")  # the next change a watch from ``after`` sees
    watch = Watch(apiserver.client(), "/api/v1/nodes", {"resourceVersion": after})
    try:
        assert watch.take(1) == [("ADDED", "marker")]
    finally:
        watch.close()


@pytest.mark.usefixtures("node")
def test_list_directives_replace_and_set_element_order(apiserver: ApiServer) -> None:
    """``$setElementOrder/conditions`` orders the list (alone or with a patch of it);
    ``{"$patch": "replace"}`` in the list replaces it with the patch's other elements."""
    _patch(apiserver, {"status": {"conditions": [ENFORCED]}})
    order = [{"type": "Ready"}, {"type": "GPUPowerCapEnforced"}]
    assert _patch(apiserver, {"status": {"$setElementOrder/conditions": order}}).status == 200
    assert _types(apiserver) == ["Ready", "GPUPowerCapEnforced"]
    extra = {"type": "X", "status": "True"}
    reorder = {
        "status": {
            "$setElementOrder/conditions": [{"type": "X"}, *reversed(order)],
            "conditions": [extra],
        }
    }
    assert _patch(apiserver, reorder).status == 200
    assert _types(apiserver) == ["X", "GPUPowerCapEnforced", "Ready"]
    replace = {"status": {"conditions": [KUBELET_READY, {"$patch": "replace"}]}}
    assert _patch(apiserver, replace).status == 200
    assert _conditions(apiserver) == [KUBELET_READY]


@pytest.mark.usefixtures("node")
def test_condition_times_are_stored_as_whole_seconds_in_utc(apiserver: ApiServer) -> None:
    """A condition's times are ``metav1.Time``: any RFC 3339 fraction and offset are
    accepted and stored as whole seconds in UTC."""
    beat = {
        "type": "GPUPowerCapEnforced",
        "status": "True",
        "lastHeartbeatTime": "2025-03-01T12:05:00.75+02:00",
        "lastTransitionTime": "2025-03-01T10:00:00.123456Z",
    }
    answer = _patch(apiserver, {"status": {"conditions": [beat]}})
    (stored,) = [c for c in answer.body["status"]["conditions"] if c["type"] == beat["type"]]
    assert (stored["lastHeartbeatTime"], stored["lastTransitionTime"]) == (
        "2025-03-01T10:05:00Z",
        "2025-03-01T10:00:00Z",
    )


@pytest.mark.usefixtures("node")
def test_status_fields_beside_conditions_merge_as_json_merge(apiserver: ApiServer) -> None:
    """Other status maps merge key by key and a null deletes a key; addresses merge by
    type; the status subresource takes the metadata's labels too, never the spec."""
    seed = {"status": {"capacity": {"cpu": "8", "nvidia.com/gpu": "8"}, "phase": "Running"}}
    _patch(apiserver, seed)
    patch = {
        "metadata": {"labels": {"sneaky": "yes"}},
        "spec": {"unschedulable": True},
        "status": {
            "capacity": {"nvidia.com/gpu": "7", "cpu": None},
            "addresses": [{"type": "InternalIP", "address": "10.0.0.9"}],
        },
    }
    answer = _patch(apiserver, patch)
    assert answer.body["status"]["capacity"] == {"nvidia.com/gpu": "7"}
    assert answer.body["status"]["phase"] == "Running"
    assert answer.body["status"]["addresses"] == [{"type": "InternalIP", "address": "10.0.0.9"}]
    assert answer.body["status"]["conditions"] == [KUBELET_READY]
    assert answer.body["metadata"]["labels"] == {"sneaky": "yes"}
    assert "unschedulable" not in answer.body["spec"]


@pytest.mark.usefixtures("node")
def test_json_merge_patch_replaces_the_conditions_list(apiserver: ApiServer) -> None:
    """Under application/merge-patch+json a conditions list replaces the whole list, as
    Kubernetes does for lists under JSON merge patch: the kubelet's Ready is gone."""
    answer = _patch(apiserver, {"status": {"conditions": [ENFORCED]}}, MERGE_PATCH)
    assert answer.status == 200
    assert _conditions(apiserver) == [ENFORCED]


@pytest.mark.usefixtures("node")
def test_json_patch_applies_to_the_status(apiserver: ApiServer) -> None:
    """application/json-patch+json (RFC 6902) is applied to the Node, its status kept:
    an add at the end, a test, a remove at an index; one that does not apply (a failed
    test, a path not there, an unknown op) is 422 and writes nothing; one that is not a
    list 400."""
    add = [{"op": "add", "path": "/status/conditions/-", "value": ENFORCED}]
    assert _patch(apiserver, add, JSON_PATCH).status == 200
    remove = [
        {"op": "test", "path": "/status/conditions/0/type", "value": "Ready"},
        {"op": "remove", "path": "/status/conditions/0"},
    ]
    assert _patch(apiserver, remove, JSON_PATCH).status == 200
    assert _conditions(apiserver) == [ENFORCED]
    before = apiserver.node("n1")
    unknown = [{"op": "bogus", "path": "/status"}]
    for refused in (remove, [{"op": "remove", "path": "/status/conditions/5"}], unknown):
        answer = _patch(apiserver, refused, JSON_PATCH)
        assert (answer.status, answer.reason) == (422, "Invalid")
    # Not through the client: it sends a JSON patch that is no list as a strategic merge.
    headers = {"Content-Type": JSON_PATCH}
    single = raw_request(apiserver, "PATCH", STATUS, body=b'{"op": "remove"}', headers=headers)
    assert (single.status, single.reason) == (400, "BadRequest")
    assert apiserver.node("n1") == before


@pytest.mark.usefixtures("node")
@pytest.mark.parametrize("content_type", ["application/json", "text/plain"])
def test_other_content_types_are_415(apiserver: ApiServer, content_type: str) -> None:
    """Plain JSON and anything that is no patch type answer 415 UnsupportedMediaType with
    a Status body; the Node is not written."""
    before = apiserver.node("n1")
    answer = raw_request(
        apiserver,
        "PATCH",
        STATUS,
        body=b'{"status": {}}',
        headers={"Content-Type": content_type},
    )
    assert (answer.status, answer.reason) == (415, "UnsupportedMediaType")
    assert apiserver.node("n1") == before


@pytest.mark.usefixtures("node")
@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        ({"status": {"conditions": [{"status": "True"}]}}, 500, "InternalError"),  # no merge key
        ({"status": {"conditions": [{"$patch": "delete"}]}}, 500, "InternalError"),
        ({"status": {"conditions": [{"type": "X", "$patch": "merge"}]}}, 500, "InternalError"),
        ({"status": {"conditions": ["Ready"]}}, 500, "InternalError"),  # not a map
        ({"status": {"conditions": "Ready"}}, 422, "Invalid"),
        ({"status": "nope"}, 422, "Invalid"),
        ({"status": {"conditions": [{**ENFORCED, "lastHeartbeatTime": "soon"}]}}, 422, "Invalid"),
        ([{"op": "add"}], 400, "BadRequest"),
        ({"metadata": {"resourceVersion": "1"}, "status": {}}, 409, "Conflict"),
    ],
)
def test_refused_patches(apiserver: ApiServer, body: object, status: int, reason: str) -> None:
    """A condition without its merge key (also in a delete), ``$patch: merge``, a
    condition that is not a map (500, as the real server answers them); conditions or
    a status of the wrong type, a time that is not RFC 3339 (422); a patch that is not
    a map (400); a stale resourceVersion precondition (409): Status bodies, nothing
    written."""
    before = apiserver.node("n1")
    answer = _patch(apiserver, body)
    assert (answer.status, answer.body["kind"]) == (status, "Status")
    assert answer.body.get("reason", "InternalError") == reason
    assert apiserver.node("n1") == before


def test_unknown_node_is_404(apiserver: ApiServer) -> None:
    """A status patch of a Node that does not exist answers 404 NotFound naming it."""
    answer = call(
        apiserver.client(),
        "PATCH",
        "/api/v1/nodes/ghost/status",
        body={"status": {"conditions": [ENFORCED]}},
        content_type=SMP,
    )
    assert (answer.status, answer.reason) == (404, "NotFound")
    assert answer.body["details"] == {"name": "ghost", "kind": "nodes"}


@pytest.mark.usefixtures("fake_node")
def test_injected_faults_on_node_status(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """Fault injection: the real server cannot do this on demand.
    fail_next("node_status") answers 429 with Retry-After, then 500, each once; the
    refused patches write nothing; the next one lands; all three are in the request log
    with method and User-Agent."""
    kube_apiserver.fail_next("node_status", 429, retry_after=4)
    kube_apiserver.fail_next("node_status", 500)
    client = make_client("capwatch-controller/r0")
    body = {"status": {"conditions": [ENFORCED]}}
    throttled = call(client, "PATCH", STATUS, body=body, content_type=SMP)
    assert (throttled.status, throttled.reason, throttled.headers["Retry-After"]) == (
        429,
        "TooManyRequests",
        "4",
    )
    failed = call(client, "PATCH", STATUS, body=body, content_type=SMP)
    assert (failed.status, failed.reason) == (500, "InternalError")
    assert _conditions(kube_apiserver) == [KUBELET_READY]
    assert call(client, "PATCH", STATUS, body=body, content_type=SMP).status == 200
    requests = kube_apiserver.requests("node_status")
    assert [(r.method, r.user_agent) for r in requests] == [("PATCH", "capwatch-controller/r0")] * 3
    assert len(kube_apiserver.node_status_writes()) == 1


@pytest.mark.usefixtures("fake_node")
def test_write_log_records_who_wrote_while_which_lease_was_held(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """The write log that proves fencing (the fake's alone; a real server's nearest is
    its audit log). Every status write is logged with server time, node, body,
    User-Agent and each
    Lease's holder and last renewal at that instant: a write by the old leader after a
    takeover shows the new holder, so a fencing check can catch it."""
    lease_path = "/apis/coordination.k8s.io/v1/namespaces/capwatch/leases"
    a, b = make_client("capwatch-controller/a"), make_client("capwatch-controller/b")
    spec = {"leaseDurationSeconds": 15, "renewTime": "2025-03-01T10:00:00.000000Z"}
    created = call(
        a,
        "POST",
        lease_path,
        body={"metadata": {"name": "shard-0"}, "spec": {**spec, "holderIdentity": "a"}},
    )
    body = {"status": {"conditions": [ENFORCED]}}
    call(a, "PATCH", STATUS, body=body, content_type=SMP)
    call(
        b,
        "PUT",
        f"{lease_path}/shard-0",
        body={
            "metadata": {"name": "shard-0", "resourceVersion": created.rv},
            "spec": {**spec, "holderIdentity": "b"},
        },
    )
    beat = {"type": "GPUPowerCapEnforced", "lastHeartbeatTime": "2025-03-01T10:05:00Z"}
    call(a, "PATCH", STATUS, body={"status": {"conditions": [beat]}}, content_type=SMP)

    first, late = kube_apiserver.node_status_writes("n1")
    (created_write, takeover) = kube_apiserver.lease_writes("capwatch", "shard-0")
    assert (first.node, first.patch, first.user_agent) == ("n1", body, "capwatch-controller/a")
    held = first.lease("capwatch", "shard-0")
    assert held is not None
    assert (held.holder, held.renewed_by, held.renewed_at) == (
        "a",
        "capwatch-controller/a",
        created_write.at,
    )
    assert held.renewed_at <= first.at
    now_held = late.lease("capwatch", "shard-0")
    assert now_held is not None
    assert (now_held.holder, now_held.renewed_at) == ("b", takeover.at)
    assert late.user_agent == "capwatch-controller/a"  # a non-holder wrote: catchable
    assert first.at <= takeover.at <= late.at
    assert int(late.resource_version) > int(first.resource_version)


@pytest.mark.usefixtures("fake_node")
def test_write_log_has_every_successful_write_and_no_refused_one(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """The fake's write log: a write that changes nothing is still logged (the client's
    PATCH did succeed), with its content type; a refused one is not."""
    client = make_client("capwatch-controller/r0")
    delete = {"status": {"conditions": [{"type": "GPUPowerCapEnforced", "$patch": "delete"}]}}
    call(client, "PATCH", STATUS, body={"status": {"conditions": [ENFORCED]}}, content_type=SMP)
    call(client, "PATCH", STATUS, body=delete, content_type=SMP)
    call(client, "PATCH", STATUS, body=delete, content_type=SMP)
    call(client, "PATCH", STATUS, body={"status": "nope"}, content_type=SMP)
    call(client, "PATCH", STATUS, body={"status": {}}, content_type=MERGE_PATCH)
    writes = kube_apiserver.node_status_writes("n1")
    assert [w.content_type for w in writes] == [SMP, SMP, SMP, MERGE_PATCH]
    assert {w.user_agent for w in writes} == {"capwatch-controller/r0"}
