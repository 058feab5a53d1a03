"""The fake API server's wire format, checked by the real client's own parsers, on the fake
and on a real kube-apiserver (``apiserver``).

If these pass, the ``kubernetes`` package deserializes the fake's lists, watch
events and Status errors into its models exactly as it does a real server's.
The tests taking ``kube_apiserver`` are the fake's alone (fault injection and
stream controls: the real server cannot do this on demand).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import kubernetes.watch
import pytest

from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.kube.rawapi import Watch, client_for
from tests.kube.servers import ApiServer
from tests.kube.support import NODE, OTHER_NODE

SELECTOR = f"spec.nodeName={NODE}"


@pytest.fixture
def core(kube_apiserver: FakeKubeApiServer) -> Iterator[kubernetes.client.CoreV1Api]:
    """The ``kubernetes`` package's client for the fake: its models must decode the answers."""
    configuration = kubernetes.client.Configuration(host=kube_apiserver.url)
    configuration.retries = False
    with kubernetes.client.ApiClient(configuration) as client:
        yield kubernetes.client.CoreV1Api(client)


def _core(server: ApiServer) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(server.library_client())


def _status(err: kubernetes.client.ApiException) -> dict[str, Any]:
    body = json.loads(err.body)
    assert body["kind"] == "Status"
    assert body["apiVersion"] == "v1"
    assert body["status"] == "Failure"
    assert body["code"] == err.status
    return body


def test_list_is_a_paged_pod_list_the_client_deserializes(apiserver: ApiServer) -> None:
    """PodList JSON with resourceVersion (no older than the writes before it), continue
    tokens serving one consistent snapshot at that version, field-selected items with
    annotations, nodeName and phase; remainingItemCount only for a list without
    selectors (the real server cannot count a selection)."""
    for i in range(3):
        apiserver.add_pod("ns", f"p{i}", node=NODE, annotations={"i": str(i)})
    apiserver.add_pod("ns", "other", node=OTHER_NODE)
    written = int(apiserver.resource_version())
    core = _core(apiserver)
    first = core.list_pod_for_all_namespaces(field_selector=SELECTOR, limit=2)
    assert isinstance(first, kubernetes.client.V1PodList)
    assert int(first.metadata.resource_version) >= written
    assert first.metadata.remaining_item_count is None
    apiserver.add_pod("ns", "p9", node=NODE)  # after the snapshot: not in page 2
    second = core.list_pod_for_all_namespaces(
        field_selector=SELECTOR, limit=2, _continue=first.metadata._continue
    )
    assert second.metadata._continue is None
    assert second.metadata.resource_version == first.metadata.resource_version
    pods = [*first.items, *second.items]
    assert [p.metadata.name for p in pods] == ["p0", "p1", "p2"]
    assert pods[1].metadata.annotations == {"i": "1"}
    assert {p.spec.node_name for p in pods} == {NODE}
    assert {p.status.phase for p in pods} == {"Running"}
    assert len({p.metadata.uid for p in pods}) == 3
    everything = core.list_pod_for_all_namespaces(limit=2)
    assert everything.metadata.remaining_item_count == 3


def test_namespaced_list_and_field_selector_errors(apiserver: ApiServer) -> None:
    """The namespaced endpoint filters by namespace; the real server's pod field labels
    select (with its defaults: schedulerName, restartPolicy); another field answers 400
    with a Status body."""
    apiserver.add_pod("a", "x", node=NODE)
    apiserver.add_pod("b", "y", node=NODE)
    apiserver.add_pod("b", "z", node=NODE)
    core = _core(apiserver)
    listed = core.list_namespaced_pod("b", field_selector=SELECTOR)
    assert [p.metadata.name for p in listed.items] == ["y", "z"]
    defaults = core.list_pod_for_all_namespaces(
        field_selector="spec.schedulerName=default-scheduler,spec.restartPolicy=Always,"
        "status.phase=Running,metadata.namespace!=a"
    )
    assert [p.metadata.name for p in defaults.items] == ["y", "z"]

    with pytest.raises(kubernetes.client.ApiException) as bad:
        core.list_pod_for_all_namespaces(field_selector="metadata.uid=x")
    assert bad.value.status == 400
    assert _status(bad.value)["reason"] == "BadRequest"


def test_injected_faults_are_status_errors(
    kube_apiserver: FakeKubeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    """Fault injection: the real server cannot do this on demand. Injected 429s carry
    Retry-After and injected 500s a Status body; each fault is used once, then requests
    succeed; requests are counted by kind."""
    kube_apiserver.fail_next("list", 429, retry_after=3)
    kube_apiserver.fail_next("list", 500)
    with pytest.raises(kubernetes.client.ApiException) as throttled:
        core.list_pod_for_all_namespaces()
    assert throttled.value.status == 429
    assert throttled.value.headers["Retry-After"] == "3"
    assert _status(throttled.value)["reason"] == "TooManyRequests"
    with pytest.raises(kubernetes.client.ApiException) as failed:
        core.list_pod_for_all_namespaces()
    assert _status(failed.value)["reason"] == "InternalError"
    core.list_pod_for_all_namespaces()
    assert (kube_apiserver.count("list"), kube_apiserver.count("watch")) == (3, 0)


def test_watch_streams_typed_events_and_bookmarks(apiserver: ApiServer) -> None:
    """A chunked watch from a resourceVersion yields ADDED/MODIFIED/DELETED as V1Pod
    objects, field-selected (a pod created Pending, then MODIFIED by its status; a pod
    bound onto the node is ADDED; a deleted pod is MODIFIED, its deletionTimestamp set,
    then DELETED); once a change outside the selection moved the version on after the
    watch opened, a BOOKMARK with only a resourceVersion comes before the deadline, and
    the watch ends by itself at timeoutSeconds."""
    start = apiserver.resource_version()
    apiserver.add_pod("ns", "a", node=NODE)
    apiserver.add_pod("ns", "b")  # unscheduled: not on the node yet
    apiserver.set_pod_annotations("ns", "a", {"k": "v"})
    apiserver.bind_pod("ns", "b", NODE)
    apiserver.delete_pod("ns", "a")
    stream = kubernetes.watch.Watch().stream(
        _core(apiserver).list_pod_for_all_namespaces,
        field_selector=SELECTOR,
        resource_version=start,
        allow_watch_bookmarks=True,
        timeout_seconds=4,  # its bookmark is due 2 s before: room for the write
    )
    changes = [(e["type"], e["object"]) for e in itertools.islice(stream, 6)]
    elsewhere = apiserver.add_pod("ns", "c", node=OTHER_NODE)
    rest = [(e["type"], e["raw_object"]) for e in stream]
    assert [(t, o.metadata.name) for t, o in changes] == [
        ("ADDED", "a"),
        ("MODIFIED", "a"),
        ("MODIFIED", "a"),
        ("ADDED", "b"),
        ("MODIFIED", "a"),
        ("DELETED", "a"),
    ]
    assert all(isinstance(o, kubernetes.client.V1Pod) for _, o in changes)
    assert [o.status.phase for _, o in changes[:2]] == ["Pending", "Running"]
    assert changes[2][1].metadata.annotations == {"k": "v"}
    assert changes[4][1].metadata.deletion_timestamp is not None
    assert rest, "no BOOKMARK before the end"
    assert {t for t, _ in rest} == {"BOOKMARK"}  # the real cache may send two
    raw = rest[0][1]
    assert (raw["kind"], raw["apiVersion"]) == ("Pod", "v1")
    assert list(raw["metadata"]) == ["resourceVersion"]
    assert int(raw["metadata"]["resourceVersion"]) >= int(elsewhere["metadata"]["resourceVersion"])


def test_stream_controls_and_leaving_the_selection(
    kube_apiserver: FakeKubeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    """Stream controls: the real server cannot do this on demand. A pod moved off the
    node (which a real nodeName never is) is DELETED; a bookmark asked for goes to the
    open watches at the current resourceVersion; end_watches ends them cleanly; the
    request log has the watch's query."""
    start = str(kube_apiserver.resource_version)
    kube_apiserver.add_pod("ns", "b", node=OTHER_NODE)
    kube_apiserver.update_pod("ns", "b", node=NODE)
    kube_apiserver.update_pod("ns", "b", node=OTHER_NODE)
    stream = kubernetes.watch.Watch().stream(
        core.list_pod_for_all_namespaces,
        field_selector=SELECTOR,
        resource_version=start,
        allow_watch_bookmarks=True,
        timeout_seconds=30,
    )
    events = [(e["type"], e["raw_object"]) for e in itertools.islice(stream, 2)]
    kube_apiserver.bookmark()
    events += [(e["type"], e["raw_object"]) for e in itertools.islice(stream, 1)]
    kube_apiserver.end_watches()
    assert list(stream) == []
    assert [(t, o["metadata"].get("name")) for t, o in events] == [
        ("ADDED", "b"),
        ("DELETED", "b"),
        ("BOOKMARK", None),
    ]
    assert events[2][1]["metadata"] == {"resourceVersion": str(kube_apiserver.resource_version)}
    watch = kube_apiserver.requests("watch")[0]
    assert (watch.query["watch"], watch.query["timeoutSeconds"]) == ("true", "30")


def test_watch_bookmarks_come_as_the_real_watch_cache_sends_them(apiserver: ApiServer) -> None:
    """With allowWatchBookmarks, a watch whose kind changed after it opened (here
    outside its selection) gets a BOOKMARK before its deadline (2 s before; the real
    cache may add one more), then its clean end; one whose kind stayed quiet gets none;
    without allowWatchBookmarks, nothing at all."""
    apiserver.add_node("n1")
    client = apiserver.client()
    query = {"resourceVersion": apiserver.resource_version(), "timeoutSeconds": "4"}
    bookmarks = {**query, "allowWatchBookmarks": "true"}
    quiet = Watch(client, "/api/v1/nodes", bookmarks)
    moved = Watch(client, "/api/v1/namespaces/ns/pods", bookmarks)
    refused = Watch(client, "/api/v1/namespaces/ns/pods", query)
    try:
        added = apiserver.add_pod("elsewhere", "p", node=NODE)
        got = {name: w.rest() for name, w in (("q", quiet), ("m", moved), ("r", refused))}
    finally:
        for watch in (quiet, moved, refused):
            watch.close()
    assert got["q"] == []
    assert got["r"] == []
    assert {e["type"] for e in got["m"]} == {"BOOKMARK"}
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in got["m"]]
    assert min(versions) >= int(added["metadata"]["resourceVersion"])


def test_periodic_bookmarks_at_the_fakes_frequency() -> None:
    """The fake's own setting (a real server's period is a minute, not settable): with
    bookmark_frequency 0.2 s a watch whose kind changed after it opened gets a BOOKMARK
    that often until 2 s before its deadline."""
    frequent = FakeKubeApiServer(bookmark_frequency=0.2)
    frequent.start()
    client = client_for(frequent, user_agent="test")
    try:
        query = {
            "resourceVersion": str(frequent.resource_version),
            "allowWatchBookmarks": "true",
            "timeoutSeconds": "3",
        }
        watch = Watch(client, "/api/v1/namespaces/ns/pods", query)
        try:
            frequent.add_pod("elsewhere", "p", node=NODE)
            kinds = [e["type"] for e in watch.rest()]
        finally:
            watch.close()
    finally:
        client.close()
        frequent.stop()
    assert len(kinds) >= 2
    assert set(kinds) == {"BOOKMARK"}


def test_watch_transport_is_chunked(apiserver: ApiServer) -> None:
    """The watch response uses Transfer-Encoding: chunked, one JSON event per chunk
    and line; with resourceVersion=0 it starts with the current state as ADDED."""
    apiserver.add_pod("ns", "a", node=NODE)
    response = _core(apiserver).list_namespaced_pod(
        "ns", watch=True, resource_version="0", timeout_seconds=5, _preload_content=False
    )
    try:
        assert response.headers["Transfer-Encoding"] == "chunked"
        first = next(response.read_chunked())
    finally:
        response.close()
        response.release_conn()
    assert first.endswith(b"\n")
    event = json.loads(first)
    assert event["type"] == "ADDED"
    assert event["object"]["kind"] == "Pod"
    assert event["object"]["metadata"]["name"] == "a"
