"""The fake API server's Nodes: list (paged, by label), get, and watch, with the same
resourceVersion, event and bookmark semantics as pods; raw calls as the controller's.
On the fake and on a real kube-apiserver (``apiserver``); the tests taking
``kube_apiserver`` use the fake's fault injection and counters, which the real server
cannot do on demand. 410s: test_fake_expiry."""

from __future__ import annotations

from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.kube.conftest import ClientFactory
from tests.kube.rawapi import Watch, call
from tests.kube.servers import ApiServer

GPU = {"nvidia.com/gpu.present": "true"}
SELECTOR = "nvidia.com/gpu.present=true"


def _names(items: list[dict[str, object]]) -> list[str]:
    return [str(item["metadata"]["name"]) for item in items]  # type: ignore[index]


def test_node_list_pages_a_consistent_label_selected_snapshot(apiserver: ApiServer) -> None:
    """A NodeList by labelSelector, sorted by name, paged with limit/continue over the
    snapshot of the first page (a node added meanwhile is not in page 2), at the first
    page's resourceVersion; remainingItemCount only without a selector; items carry no
    kind/apiVersion; a fieldSelector by name selects one."""
    for name in ("n3", "n1", "n2"):
        apiserver.add_node(name, labels=GPU)
    apiserver.add_node("cpu-node", labels={"kubernetes.io/os": "linux"})
    client = apiserver.client("capwatch-controller/r0")

    first = call(client, "GET", "/api/v1/nodes", query={"labelSelector": SELECTOR, "limit": "2"})
    assert first.status == 200
    assert (first.body["kind"], first.body["apiVersion"]) == ("NodeList", "v1")
    assert "remainingItemCount" not in first.body["metadata"]
    apiserver.add_node("n0", labels=GPU)
    second = call(
        client,
        "GET",
        "/api/v1/nodes",
        query={
            "labelSelector": SELECTOR,
            "limit": "2",
            "continue": first.body["metadata"]["continue"],
        },
    )
    assert "continue" not in second.body["metadata"]
    assert second.rv == first.rv
    items = [*first.body["items"], *second.body["items"]]
    assert _names(items) == ["n1", "n2", "n3"]
    assert all("kind" not in item for item in items)
    assert items[0]["metadata"]["labels"] == GPU
    assert [c["type"] for c in items[0]["status"]["conditions"]] == ["Ready"]

    everything = call(client, "GET", "/api/v1/nodes", query={"limit": "2"})
    assert _names(everything.body["items"]) == ["cpu-node", "n0"]
    assert everything.body["metadata"]["remainingItemCount"] == 3
    by_name = call(client, "GET", "/api/v1/nodes", query={"fieldSelector": "metadata.name=n2"})
    assert _names(by_name.body["items"]) == ["n2"]
    schedulable = call(
        client, "GET", "/api/v1/nodes", query={"fieldSelector": "spec.unschedulable=false"}
    )
    assert _names(schedulable.body["items"]) == ["cpu-node", "n0", "n1", "n2", "n3"]


def test_node_get_and_not_found(apiserver: ApiServer) -> None:
    """GET of one Node answers it with kind/apiVersion (also at /status); an unknown Node
    is a 404 NotFound Status naming it; the admin's read shows the same JSON."""
    apiserver.add_node("n1", labels=GPU, conditions=[])
    client = apiserver.client()
    got = call(client, "GET", "/api/v1/nodes/n1")
    assert got.status == 200
    assert (got.body["kind"], got.body["apiVersion"]) == ("Node", "v1")
    assert got.body["status"].get("conditions", []) == []
    assert call(client, "GET", "/api/v1/nodes/n1/status").body == got.body
    node = apiserver.node("n1")
    assert node is not None
    assert {"kind": "Node", "apiVersion": "v1", **node} == got.body
    missing = call(client, "GET", "/api/v1/nodes/absent")
    assert (missing.status, missing.reason) == (404, "NotFound")
    assert missing.body["details"] == {"name": "absent", "kind": "nodes"}
    assert apiserver.node("absent") is None


def test_node_requests_are_logged_by_kind(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """The fake's request log (the real server's is its audit log): node GETs are
    ``node_get``, lists and watches are counted apart from pods'."""
    kube_apiserver.add_node("n1")
    client = make_client("t")
    call(client, "GET", "/api/v1/nodes/n1")
    call(client, "GET", "/api/v1/nodes/n1/status")
    call(client, "GET", "/api/v1/nodes")
    assert [r.kind for r in kube_apiserver.requests()] == ["node_get", "node_get", "node_list"]


def test_node_watch_by_label_follows_nodes_joining_and_leaving(apiserver: ApiServer) -> None:
    """A node watch by labelSelector from a resourceVersion: ADDED for a new GPU node,
    DELETED when its label goes (its last matching state, stamped at that change), ADDED
    when it comes back, DELETED when the Node is deleted; nodes never matching never
    show; after a change made once it is open, a BOOKMARK carries only a resourceVersion;
    the stream ends by itself."""
    start = apiserver.resource_version()
    apiserver.add_node("n1", labels=GPU)
    apiserver.add_node("cpu", labels={})
    left = apiserver.set_node_labels("n1", {"nvidia.com/gpu.present": "false"})
    apiserver.set_node_labels("n1", GPU)
    apiserver.delete_node("n1")
    watch = Watch(
        apiserver.client("capwatch-controller/r0"),
        "/api/v1/nodes",
        {
            "labelSelector": SELECTOR,
            "resourceVersion": start,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": "4",
        },
    )
    try:
        events = [watch.next() for _ in range(4)]
        later = apiserver.add_node("cpu-2")
        rest = watch.rest()
    finally:
        watch.close()
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "n1"),
        ("DELETED", "n1"),
        ("ADDED", "n1"),
        ("DELETED", "n1"),
    ]
    assert all((e["object"]["kind"], e["object"]["apiVersion"]) == ("Node", "v1") for e in events)
    assert events[1]["object"]["metadata"]["labels"] == GPU
    assert events[1]["object"]["metadata"]["resourceVersion"] == left["metadata"]["resourceVersion"]
    assert rest, "no BOOKMARK before the end"
    assert {e["type"] for e in rest} == {"BOOKMARK"}
    bookmark = rest[0]["object"]
    assert (bookmark["kind"], bookmark["apiVersion"]) == ("Node", "v1")
    assert list(bookmark["metadata"]) == ["resourceVersion"]
    assert int(bookmark["metadata"]["resourceVersion"]) >= int(later["metadata"]["resourceVersion"])


def test_node_watch_from_zero(apiserver: ApiServer) -> None:
    """With resourceVersion 0 a node watch starts with the current matching Nodes as
    ADDED; after them only BOOKMARKs (if any), then its clean end at timeoutSeconds."""
    apiserver.add_node("n1", labels=GPU)
    apiserver.add_node("n2", labels={})
    watch = Watch(
        apiserver.client(),
        "/api/v1/nodes",
        {
            "labelSelector": SELECTOR,
            "resourceVersion": "0",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": "2",
        },
    )
    try:
        assert watch.take(1) == [("ADDED", "n1")]
        rest = watch.rest()
    finally:
        watch.close()
    assert {e["type"] for e in rest} <= {"BOOKMARK"}


def test_open_node_and_pod_watches_are_counted_apart(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """The fake's counter of open watch streams, by request kind."""
    kube_apiserver.add_node("n1", labels=GPU)
    watch = Watch(make_client("t"), "/api/v1/nodes", {"resourceVersion": "0"})
    try:
        assert watch.take(1) == [("ADDED", "n1")]
        assert kube_apiserver.open_watch_count("node_watch") == 1
        assert kube_apiserver.open_watch_count("watch") == 0
    finally:
        watch.close()


def test_node_list_and_watch_faults(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """Fault injection: the real server cannot do this on demand. fail_next("node_list"/
    "node_watch") answer injected Status errors (429 with Retry-After, 500, or an
    in-stream ERROR) to node requests only; pod lists pass."""
    kube_apiserver.add_node("n1")
    kube_apiserver.fail_next("node_list", 429, retry_after=2)
    kube_apiserver.fail_next("node_watch", 500, in_stream=True)
    client = make_client("t")
    assert call(client, "GET", "/api/v1/pods").status == 200
    throttled = call(client, "GET", "/api/v1/nodes")
    assert (throttled.status, throttled.reason, throttled.headers["Retry-After"]) == (
        429,
        "TooManyRequests",
        "2",
    )
    assert call(client, "GET", "/api/v1/nodes").status == 200
    watch = Watch(client, "/api/v1/nodes", {"resourceVersion": "0", "timeoutSeconds": "1"})
    try:
        (event,) = watch.rest()
    finally:
        watch.close()
    assert (event["type"], event["object"]["code"]) == ("ERROR", 500)
    assert (kube_apiserver.count("node_list"), kube_apiserver.count("node_watch")) == (2, 1)
    assert kube_apiserver.count("list") == 1
