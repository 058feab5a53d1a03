"""The fake API server's Nodes: list (paged, by label), get, and watch, with the same
resourceVersion, event and bookmark semantics as pods; raw calls as the controller's."""

from __future__ import annotations

import pytest

from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.kube.conftest import ClientFactory
from tests.kube.rawapi import Watch, call

GPU = {"nvidia.com/gpu.present": "true"}
SELECTOR = "nvidia.com/gpu.present=true"


def _names(items: list[dict[str, object]]) -> list[str]:
    return [str(item["metadata"]["name"]) for item in items]  # type: ignore[index]


def test_node_list_pages_a_consistent_label_selected_snapshot(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """A NodeList by labelSelector, sorted by name, paged with limit/continue over the
    snapshot of the first page (a node added meanwhile is not in page 2), with
    remainingItemCount; items carry no kind/apiVersion; an expired token is 410."""
    for name in ("n3", "n1", "n2"):
        kube_apiserver.add_node(name, labels=GPU)
    kube_apiserver.add_node("cpu-node", labels={"kubernetes.io/os": "linux"})
    client = make_client("capwatch-controller/r0")

    first = call(client, "GET", "/api/v1/nodes", query={"labelSelector": SELECTOR, "limit": "2"})
    assert first.status == 200
    assert (first.body["kind"], first.body["apiVersion"]) == ("NodeList", "v1")
    assert first.body["metadata"]["remainingItemCount"] == 1
    kube_apiserver.add_node("n0", labels=GPU)
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

    everything = call(client, "GET", "/api/v1/nodes")
    assert _names(everything.body["items"]) == ["cpu-node", "n0", "n1", "n2", "n3"]
    by_name = call(client, "GET", "/api/v1/nodes", query={"fieldSelector": "metadata.name=n2"})
    assert _names(by_name.body["items"]) == ["n2"]

    page = call(client, "GET", "/api/v1/nodes", query={"limit": "1"})
    kube_apiserver.compact()
    expired = call(
        client,
        "GET",
        "/api/v1/nodes",
        query={"limit": "1", "continue": page.body["metadata"]["continue"]},
    )
    assert (expired.status, expired.reason) == (410, "Expired")


def test_node_get_and_not_found(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """GET of one Node answers it with kind/apiVersion (also at /status); an unknown Node
    is a 404 NotFound Status naming it; the test helper node() shows the same JSON."""
    kube_apiserver.add_node("n1", labels=GPU, conditions=[])
    client = make_client("t")
    got = call(client, "GET", "/api/v1/nodes/n1")
    assert got.status == 200
    assert (got.body["kind"], got.body["apiVersion"]) == ("Node", "v1")
    assert got.body["status"] == {"conditions": []}
    assert call(client, "GET", "/api/v1/nodes/n1/status").body == got.body
    node = kube_apiserver.node("n1")
    assert node is not None
    assert {"kind": "Node", "apiVersion": "v1", **node} == got.body
    missing = call(client, "GET", "/api/v1/nodes/absent")
    assert (missing.status, missing.reason) == (404, "NotFound")
    assert missing.body["details"]["name"] == "absent"
    assert kube_apiserver.node("absent") is None
    assert [r.kind for r in kube_apiserver.requests()] == ["node_get"] * 3


def test_node_watch_by_label_follows_nodes_joining_and_leaving(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """A node watch by labelSelector from a resourceVersion: ADDED for a new GPU node,
    DELETED when its label goes (stamped at that change), ADDED when it comes back,
    DELETED when the Node is deleted; nodes never matching never show; a BOOKMARK
    carries only the current resourceVersion; the stream ends by itself."""
    start = str(kube_apiserver.resource_version)
    kube_apiserver.add_node("n1", labels=GPU)
    kube_apiserver.add_node("cpu", labels={})
    kube_apiserver.update_node_labels("n1", {"nvidia.com/gpu.present": "false"})
    left_at = str(kube_apiserver.resource_version)
    kube_apiserver.update_node_labels("n1", GPU)
    kube_apiserver.delete_node("n1")
    watch = Watch(
        make_client("capwatch-controller/r0"),
        "/api/v1/nodes",
        {
            "labelSelector": SELECTOR,
            "resourceVersion": start,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": "3",
        },
    )
    try:
        events = [watch.next() for _ in range(4)]
        kube_apiserver.bookmark()
        bookmark = watch.next()
        kube_apiserver.end_watches()
        assert watch.rest() == []
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
    assert events[1]["object"]["metadata"]["resourceVersion"] == left_at
    assert bookmark == {
        "type": "BOOKMARK",
        "object": {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(kube_apiserver.resource_version)},
        },
    }
    assert kube_apiserver.requests("node_watch")[0].query["labelSelector"] == SELECTOR


def test_node_watch_from_zero_and_quiet_bookmarks(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """With resourceVersion 0 a node watch starts with the current matching Nodes as
    ADDED; a quiet one gets the watch cache's BOOKMARK 2 s before timeoutSeconds, then
    its clean end. Pod and node watches are counted apart."""
    kube_apiserver.add_node("n1", labels=GPU)
    kube_apiserver.add_node("n2", labels={})
    client = make_client("t")
    watch = Watch(
        client,
        "/api/v1/nodes",
        {
            "labelSelector": SELECTOR,
            "resourceVersion": "0",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": "3",
        },
    )
    try:
        assert watch.take(1) == [("ADDED", "n1")]
        assert kube_apiserver.open_watch_count("node_watch") == 1
        assert kube_apiserver.open_watch_count("watch") == 0
        rest = watch.rest()
    finally:
        watch.close()
    assert [e["type"] for e in rest] == ["BOOKMARK"]
    assert rest[0]["object"]["metadata"]["resourceVersion"] == str(kube_apiserver.resource_version)


@pytest.mark.parametrize("gone_mode", ["http", "event"])
def test_expired_node_watch_is_410(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory, gone_mode: str
) -> None:
    """A node watch from before the compacted history is 410 Expired, as an HTTP 410 or
    as an ERROR event on a 200 stream (``gone_mode``), as for pods."""
    kube_apiserver.gone_mode = gone_mode  # type: ignore[assignment]
    old = str(kube_apiserver.resource_version)
    kube_apiserver.add_node("n1")
    kube_apiserver.compact()
    client = make_client("t")
    query = {"resourceVersion": old, "timeoutSeconds": "1"}
    if gone_mode == "http":
        answer = call(client, "GET", "/api/v1/nodes", query={**query, "watch": "true"})
        assert (answer.status, answer.reason) == (410, "Expired")
        return
    watch = Watch(client, "/api/v1/nodes", query)
    try:
        (event,) = watch.rest()
    finally:
        watch.close()
    assert event["type"] == "ERROR"
    assert (event["object"]["code"], event["object"]["reason"]) == (410, "Expired")


def test_node_list_and_watch_faults(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """fail_next("node_list"/"node_watch") answer injected Status errors (429 with
    Retry-After, 500, or an in-stream ERROR) to node requests only; pod lists pass."""
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
