"""The fake API server's wire format, checked by the real client's own parsers.

If these pass, the ``kubernetes`` package deserializes the fake's lists, watch
events and Status errors into its models exactly as it does a real server's.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
from typing import Any

import kubernetes.client
import kubernetes.watch
import pytest

from tests.fakes.kube_apiserver import FakeKubeApiServer, GoneMode
from tests.kube.support import NODE, OTHER_NODE

SELECTOR = f"spec.nodeName={NODE}"


@pytest.fixture
def core(kube_api_client: kubernetes.client.ApiClient) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(kube_api_client)


def _status(err: kubernetes.client.ApiException) -> dict[str, Any]:
    body = json.loads(err.body)
    assert body["kind"] == "Status"
    assert body["apiVersion"] == "v1"
    assert body["status"] == "Failure"
    assert body["code"] == err.status
    return body


def test_list_is_a_paged_pod_list_the_client_deserializes(
    kube_apiserver: FakeKubeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    """PodList JSON with resourceVersion, continue tokens serving one consistent
    snapshot, field-selected items with annotations, nodeName and phase."""
    for i in range(3):
        kube_apiserver.add_pod("ns", f"p{i}", node=NODE, annotations={"i": str(i)})
    kube_apiserver.add_pod("ns", "other", node=OTHER_NODE)
    first = core.list_pod_for_all_namespaces(field_selector=SELECTOR, limit=2)
    assert isinstance(first, kubernetes.client.V1PodList)
    assert first.metadata.resource_version == str(kube_apiserver.resource_version)
    assert first.metadata.remaining_item_count == 1
    kube_apiserver.add_pod("ns", "p9", node=NODE)  # after the snapshot: not in page 2
    second = core.list_pod_for_all_namespaces(
        field_selector=SELECTOR, limit=2, _continue=first.metadata._continue
    )
    assert second.metadata._continue is None
    pods = [*first.items, *second.items]
    assert [p.metadata.name for p in pods] == ["p0", "p1", "p2"]
    assert pods[1].metadata.annotations == {"i": "1"}
    assert {p.spec.node_name for p in pods} == {NODE}
    assert {p.status.phase for p in pods} == {"Running"}
    assert len({p.metadata.uid for p in pods}) == 3


def test_namespaced_list_and_selector_errors(
    kube_apiserver: FakeKubeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    """The namespaced endpoint filters by namespace; an unsupported field selector
    and an expired continue token answer 400 and 410 with Status bodies."""
    kube_apiserver.add_pod("a", "x", node=NODE)
    kube_apiserver.add_pod("b", "y", node=NODE)
    kube_apiserver.add_pod("b", "z", node=NODE)
    listed = core.list_namespaced_pod("b", field_selector=SELECTOR)
    assert [p.metadata.name for p in listed.items] == ["y", "z"]

    with pytest.raises(kubernetes.client.ApiException) as bad:
        core.list_pod_for_all_namespaces(field_selector="spec.schedulerName=x")
    assert bad.value.status == 400
    assert _status(bad.value)["reason"] == "BadRequest"

    page = core.list_pod_for_all_namespaces(limit=1)
    kube_apiserver.compact()
    with pytest.raises(kubernetes.client.ApiException) as expired:
        core.list_pod_for_all_namespaces(limit=1, _continue=page.metadata._continue)
    assert expired.value.status == 410
    assert _status(expired.value)["reason"] == "Expired"


def test_injected_faults_are_status_errors(
    kube_apiserver: FakeKubeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    """Injected 429s carry Retry-After and injected 500s a Status body; each fault
    is used once, then requests succeed; requests are counted by kind."""
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


def test_watch_streams_typed_events_and_bookmarks(
    kube_apiserver: FakeKubeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    """A chunked watch from a resourceVersion yields ADDED/MODIFIED/DELETED as V1Pod
    objects (field-selected, including pods moving off the node), BOOKMARKs with only
    a resourceVersion, and ends by itself at timeoutSeconds."""
    start = str(kube_apiserver.resource_version)
    kube_apiserver.add_pod("ns", "a", node=NODE)
    kube_apiserver.add_pod("ns", "b", node=OTHER_NODE)
    kube_apiserver.update_pod("ns", "a", annotations={"k": "v"})
    kube_apiserver.update_pod("ns", "b", node=NODE)  # moves onto the node: ADDED
    kube_apiserver.update_pod("ns", "b", node=OTHER_NODE)  # moves off: DELETED
    kube_apiserver.delete_pod("ns", "a")
    stream = kubernetes.watch.Watch().stream(
        core.list_pod_for_all_namespaces,
        field_selector=SELECTOR,
        resource_version=start,
        allow_watch_bookmarks=True,
        timeout_seconds=1,
    )
    events = [(e["type"], e["object"], e["raw_object"]) for e in itertools.islice(stream, 5)]
    kube_apiserver.bookmark()  # goes to the watches open now
    events += [(e["type"], e["object"], e["raw_object"]) for e in itertools.islice(stream, 1)]
    kube_apiserver.end_watches()
    assert list(stream) == []

    assert [(t, o.metadata.name) for t, o, _ in events[:-1]] == [
        ("ADDED", "a"),
        ("MODIFIED", "a"),
        ("ADDED", "b"),
        ("DELETED", "b"),
        ("DELETED", "a"),
    ]
    assert all(isinstance(o, kubernetes.client.V1Pod) for _, o, _ in events[:-1])
    assert events[1][1].metadata.annotations == {"k": "v"}
    kind, _, raw = events[-1]
    assert kind == "BOOKMARK"
    assert raw["metadata"] == {"resourceVersion": str(kube_apiserver.resource_version)}
    watch = kube_apiserver.requests("watch")[0]
    assert watch.query["watch"] == "true"
    assert watch.query["timeoutSeconds"] == "1"


def test_watch_bookmarks_come_as_the_real_watch_cache_sends_them(
    kube_apiserver: FakeKubeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    """With allowWatchBookmarks a quiet watch gets one BOOKMARK 2 s before its deadline
    (at the current resourceVersion) and then its clean end; without it, nothing at
    all; and every bookmark_frequency seconds when that is shorter."""

    def quiet_watch(
        server: FakeKubeApiServer, *, bookmarks: bool, timeout: int
    ) -> list[tuple[str, str]]:
        client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=server.url))
        with client:
            stream = kubernetes.watch.Watch().stream(
                kubernetes.client.CoreV1Api(client).list_pod_for_all_namespaces,
                resource_version=str(server.resource_version),
                allow_watch_bookmarks=bookmarks,
                timeout_seconds=timeout,
            )
            return [(e["type"], e["raw_object"]["metadata"]["resourceVersion"]) for e in stream]

    kube_apiserver.add_pod("ns", "a", node=NODE)
    frequent = FakeKubeApiServer(bookmark_frequency=0.2)
    frequent.start()
    try:
        with concurrent.futures.ThreadPoolExecutor() as pool:
            allowed = pool.submit(quiet_watch, kube_apiserver, bookmarks=True, timeout=3)
            refused = pool.submit(quiet_watch, kube_apiserver, bookmarks=False, timeout=3)
            often = pool.submit(quiet_watch, frequent, bookmarks=True, timeout=3)
            assert allowed.result() == [("BOOKMARK", str(kube_apiserver.resource_version))]
            assert refused.result() == []
            kinds = often.result()
    finally:
        frequent.stop()
    assert len(kinds) >= 2  # 0.2 s apart until 2 s before the deadline
    assert {kind for kind, _ in kinds} == {"BOOKMARK"}


def test_watch_transport_is_chunked(
    kube_apiserver: FakeKubeApiServer, core: kubernetes.client.CoreV1Api
) -> None:
    """The watch response uses Transfer-Encoding: chunked, one JSON event per chunk
    and line; with resourceVersion=0 it starts with the current state as ADDED."""
    kube_apiserver.add_pod("ns", "a", node=NODE)
    response = core.list_pod_for_all_namespaces(
        watch=True, resource_version="0", timeout_seconds=5, _preload_content=False
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


@pytest.mark.parametrize("gone_mode", ["http", "event"])
def test_expired_watch_is_410_in_both_forms(
    kube_apiserver: FakeKubeApiServer, core: kubernetes.client.CoreV1Api, gone_mode: GoneMode
) -> None:
    """A watch from before the compacted history fails 410 Expired: as an HTTP 410
    Status, or as a 200 stream whose only event is an ERROR carrying that Status;
    the client's own Watch surfaces both as ApiException(410)."""
    kube_apiserver.gone_mode = gone_mode
    old = str(kube_apiserver.resource_version)
    kube_apiserver.add_pod("ns", "a", node=NODE)
    kube_apiserver.compact()
    with pytest.raises(kubernetes.client.ApiException) as gone:
        list(
            kubernetes.watch.Watch().stream(
                core.list_pod_for_all_namespaces, resource_version=old, timeout_seconds=1
            )
        )
    assert gone.value.status == 410
    if gone_mode == "http":
        assert _status(gone.value)["reason"] == "Expired"
        return
    response = core.list_pod_for_all_namespaces(
        watch=True, resource_version=old, timeout_seconds=1, _preload_content=False
    )
    try:
        assert response.status == 200
        (line,) = response.data.decode().splitlines()
    finally:
        response.release_conn()
    event = json.loads(line)
    assert event["type"] == "ERROR"
    assert event["object"]["kind"] == "Status"
    assert (event["object"]["code"], event["object"]["reason"]) == (410, "Expired")
