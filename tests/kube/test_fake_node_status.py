"""The fake API server's ``PATCH /api/v1/nodes/{name}/status``: strategic merge of
conditions by type, JSON merge, the refusals, watches, faults and the write log."""

from __future__ import annotations

import pytest

from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.kube.conftest import ClientFactory
from tests.kube.rawapi import MERGE_PATCH, SMP, Watch, call, raw_request

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


def _conditions(server: FakeKubeApiServer) -> list[dict[str, str]]:
    node = server.node("n1")
    assert node is not None
    return list(node["status"]["conditions"])


@pytest.fixture
def node(kube_apiserver: FakeKubeApiServer) -> None:
    kube_apiserver.add_node("n1", conditions=[KUBELET_READY])


@pytest.mark.usefixtures("node")
def test_strategic_merge_merges_conditions_by_type(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """A condition of a new type is appended; a second patch of that type replaces only
    the fields it gives; other conditions (the kubelet's Ready) are untouched; each
    write answers the Node, bumps its resourceVersion and shows on a watch as MODIFIED."""
    client = make_client("capwatch-controller/r0")
    start = str(kube_apiserver.resource_version)
    first = call(
        client, "PATCH", STATUS, body={"status": {"conditions": [ENFORCED]}}, content_type=SMP
    )
    assert first.status == 200
    assert first.body["kind"] == "Node"
    assert first.body["status"]["conditions"] == [KUBELET_READY, ENFORCED]
    assert int(first.rv) > int(start)

    heartbeat = {"type": "GPUPowerCapEnforced", "lastHeartbeatTime": "2025-03-01T10:05:00Z"}
    second = call(
        client, "PATCH", STATUS, body={"status": {"conditions": [heartbeat]}}, content_type=SMP
    )
    assert int(second.rv) > int(first.rv)
    assert _conditions(kube_apiserver) == [
        KUBELET_READY,
        {**ENFORCED, "lastHeartbeatTime": "2025-03-01T10:05:00Z"},
    ]
    watch = Watch(client, "/api/v1/nodes", {"resourceVersion": start, "timeoutSeconds": "5"})
    try:
        events = [watch.next() for _ in range(2)]
    finally:
        watch.close()
    assert [(e["type"], e["object"]["metadata"]["resourceVersion"]) for e in events] == [
        ("MODIFIED", first.rv),
        ("MODIFIED", second.rv),
    ]


@pytest.mark.usefixtures("node")
def test_strategic_merge_delete_directive_removes_one_condition(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """``{"type": X, "$patch": "delete"}`` removes that condition and no other; deleting
    one that is not there changes nothing: 200, same resourceVersion, no watch event
    (as the real storage skips a no-op write), though the write is still logged."""
    client = make_client("capwatch-controller/r0")
    call(client, "PATCH", STATUS, body={"status": {"conditions": [ENFORCED]}}, content_type=SMP)
    delete = {"status": {"conditions": [{"type": "GPUPowerCapEnforced", "$patch": "delete"}]}}
    removed = call(client, "PATCH", STATUS, body=delete, content_type=SMP)
    assert removed.status == 200
    assert _conditions(kube_apiserver) == [KUBELET_READY]
    after = str(kube_apiserver.resource_version)
    again = call(client, "PATCH", STATUS, body=delete, content_type=SMP)
    assert again.status == 200
    assert again.rv == removed.rv
    assert str(kube_apiserver.resource_version) == after
    kube_apiserver.add_node("marker")  # the next change a watch from ``after`` sees
    watch = Watch(client, "/api/v1/nodes", {"resourceVersion": after, "timeoutSeconds": "5"})
    try:
        assert watch.take(1) == [("ADDED", "marker")]
    finally:
        watch.close()
    assert len(kube_apiserver.node_status_writes("n1")) == 3


@pytest.mark.usefixtures("node")
def test_status_fields_beside_conditions_merge_as_json_merge(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """Other status maps merge key by key and a null deletes a key; lists without a merge
    key are replaced; nothing outside status is applied by the status subresource."""
    client = make_client("t")
    seed = {"status": {"capacity": {"cpu": "8", "nvidia.com/gpu": "8"}, "phase": "Running"}}
    call(client, "PATCH", STATUS, body=seed, content_type=SMP)
    patch = {
        "metadata": {"labels": {"sneaky": "yes"}},
        "spec": {"unschedulable": True},
        "status": {
            "capacity": {"nvidia.com/gpu": "7", "cpu": None},
            "addresses": [{"type": "InternalIP", "address": "10.0.0.9"}],
        },
    }
    answer = call(client, "PATCH", STATUS, body=patch, content_type=SMP)
    assert answer.body["status"]["capacity"] == {"nvidia.com/gpu": "7"}
    assert answer.body["status"]["phase"] == "Running"
    assert answer.body["status"]["addresses"] == [{"type": "InternalIP", "address": "10.0.0.9"}]
    assert answer.body["status"]["conditions"] == [KUBELET_READY]
    assert "labels" not in answer.body["metadata"]
    assert answer.body["spec"] == {}


@pytest.mark.usefixtures("node")
def test_json_merge_patch_replaces_the_conditions_list(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """Under application/merge-patch+json a conditions list replaces the whole list, as
    Kubernetes does for lists under JSON merge patch: the kubelet's Ready is gone."""
    client = make_client("t")
    answer = call(
        client,
        "PATCH",
        STATUS,
        body={"status": {"conditions": [ENFORCED]}},
        content_type=MERGE_PATCH,
    )
    assert answer.status == 200
    assert _conditions(kube_apiserver) == [ENFORCED]
    (write,) = kube_apiserver.node_status_writes()
    assert write.content_type == MERGE_PATCH


@pytest.mark.usefixtures("node")
@pytest.mark.parametrize(
    "content_type", ["application/json-patch+json", "application/json", "text/plain"]
)
def test_other_content_types_are_415(kube_apiserver: FakeKubeApiServer, content_type: str) -> None:
    """JSON patch, plain JSON and anything else answer 415 UnsupportedMediaType with a
    Status body; the Node is not written."""
    before = kube_apiserver.node("n1")
    answer = raw_request(
        kube_apiserver,
        "PATCH",
        STATUS,
        body=b'[{"op": "remove", "path": "/status/conditions/0"}]',
        headers={"Content-Type": content_type},
    )
    assert (answer.status, answer.reason) == (415, "UnsupportedMediaType")
    assert kube_apiserver.node("n1") == before
    assert kube_apiserver.node_status_writes() == []


@pytest.mark.usefixtures("node")
@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        ({"status": {"conditions": [{"status": "True"}]}}, 500, "InternalError"),  # no merge key
        ({"status": {"conditions": [{"type": "X", "$patch": "replace"}]}}, 400, "BadRequest"),
        ({"status": {"$setElementOrder/conditions": [{"type": "Ready"}]}}, 400, "BadRequest"),
        ({"status": "nope"}, 400, "BadRequest"),
        ([{"op": "add"}], 400, "BadRequest"),
        ({"metadata": {"resourceVersion": "1"}, "status": {}}, 409, "Conflict"),
    ],
)
def test_refused_patches(
    kube_apiserver: FakeKubeApiServer,
    make_client: ClientFactory,
    body: object,
    status: int,
    reason: str,
) -> None:
    """A condition without its merge key, directives the fake does not model, a status
    that is not a map, a patch that is not a map, and a stale resourceVersion
    precondition are refused with Status bodies; nothing is written or logged."""
    before = kube_apiserver.node("n1")
    answer = call(make_client("t"), "PATCH", STATUS, body=body, content_type=SMP)
    assert (answer.status, answer.reason) == (status, reason)
    assert kube_apiserver.node("n1") == before
    assert kube_apiserver.node_status_writes() == []


def test_unknown_node_is_404(kube_apiserver: FakeKubeApiServer, make_client: ClientFactory) -> None:
    """A status patch of a Node that does not exist answers 404 NotFound naming it."""
    answer = call(
        make_client("t"),
        "PATCH",
        "/api/v1/nodes/ghost/status",
        body={"status": {"conditions": [ENFORCED]}},
        content_type=SMP,
    )
    assert (answer.status, answer.reason) == (404, "NotFound")
    assert answer.body["details"] == {"name": "ghost", "group": "", "kind": "nodes"}


@pytest.mark.usefixtures("node")
def test_injected_faults_on_node_status(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """fail_next("node_status") answers 429 with Retry-After, then 500, each once; the
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


@pytest.mark.usefixtures("node")
def test_write_log_records_who_wrote_while_which_lease_was_held(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """Every status write is logged with server time, node, body, User-Agent and each
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
