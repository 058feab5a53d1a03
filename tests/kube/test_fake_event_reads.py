"""Events as capwatch writes them (the controller's Node Events, the agent's pod Events)
and as people read them back: ``kubectl describe node`` lists ``/api/v1/events`` by
``involvedObject.*`` field selectors. On the fake and on a real kube-apiserver
(``apiserver``)."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlencode

import pytest

from capwatch.agent.kube.pod_requests import KubernetesEventSink
from capwatch.agent.podevents import EventType as PodEventType
from capwatch.agent.podevents import PodEvent
from capwatch.agent.pods import PodRef
from capwatch.controller.kube import KubeApi
from capwatch.controller.writes.recorder import EventType, NodeEvent
from capwatch.kit.clock import SystemClock
from tests.kube.rawapi import Watch, call
from tests.kube.servers import ApiServer
from tests.kube.support import NODE

WALL = 1_740_823_200.0  # 2025-03-01T10:00:00Z


@pytest.fixture
def api(apiserver: ApiServer) -> Iterator[KubeApi]:
    kube = KubeApi(apiserver.client("capwatch-controller/r0"), namespace="capwatch", identity="r0")
    yield kube
    kube.close()


def _names(server: ApiServer, path: str, selector: str) -> list[str]:
    query = urlencode({"fieldSelector": selector, "limit": "500"})
    answer = call(server.client(), "GET", f"{path}?{query}")
    assert answer.status == 200, answer.body
    assert answer.body["kind"] == "EventList"
    return [str(item["metadata"]["name"]) for item in answer.body["items"]]


def _describe_node(node: str, uid: str) -> str:
    """The selector kubectl describe node sends (client-go's GetFieldSelector, sorted)."""
    return (
        f"involvedObject.kind=Node,involvedObject.name={node},"
        f"involvedObject.namespace=,involvedObject.uid={uid}"
    )


@pytest.mark.asyncio
async def test_kubectl_describe_node_finds_the_controllers_events(
    apiserver: ApiServer, api: KubeApi
) -> None:
    """The controller's Node Events (create_event: in ``default``, the involved object's
    uid being the node's name, as the kubelet has it) are found by kind and name, and by
    kubectl describe node's second query (uid = the node's name), not by its first (the
    Node's real uid); another node's and a pod's of the same name are not."""
    node = apiserver.add_node("n1")
    for wall, reason in ((WALL, "CapWriteFailed"), (WALL + 5, "CapsEnforced")):
        event = NodeEvent(node="n1", type=EventType.WARNING, reason=reason, message="m", wall=wall)
        await api.create_event(event, deadline_s=10)
    other = NodeEvent(node="n2", type=EventType.NORMAL, reason="R", message="m", wall=WALL)
    await api.create_event(other, deadline_s=10)
    sink = KubernetesEventSink(
        transport=apiserver.client("capwatch-agent"), node_name=NODE, clock=SystemClock()
    )
    sink.post(
        PodEvent(
            pod=PodRef(namespace="ns", name="n1", uid="pod-uid"),
            type=PodEventType.NORMAL,
            reason="PowerCapApplied",
            message="GPU 0 capped at 300 W",
        )
    )

    ours = _names(apiserver, "/api/v1/events", "involvedObject.kind=Node,involvedObject.name=n1")
    assert len(ours) == 2
    assert all(name.startswith("n1.") for name in ours)
    assert _names(apiserver, "/api/v1/events", _describe_node("n1", "n1")) == ours
    assert _names(apiserver, "/api/v1/events", _describe_node("n1", node["metadata"]["uid"])) == []
    assert len(_names(apiserver, "/api/v1/events", "involvedObject.name=n1")) == 3
    reasons = call(
        apiserver.client(),
        "GET",
        "/api/v1/namespaces/default/events?"
        + urlencode({"fieldSelector": "involvedObject.name=n1,type=Warning"}),
    )
    assert [i["reason"] for i in reasons.body["items"]] == ["CapWriteFailed", "CapsEnforced"]


def test_the_agents_pod_events_are_named_and_found_by_pod(apiserver: ApiServer) -> None:
    """The agent's pod Events (KubernetesEventSink: generateName ``<pod>.``) land in the
    pod's namespace named ``<pod>.`` and five characters, a pod name longer than 57
    characters cut so that the name is 63; kubectl describe pod finds them by kind,
    name, namespace and uid."""
    long_name = "p" * 70
    for name in ("trainer-0", long_name):
        # A client each: the sink leaves its connection unusable (test_event_sink_connection).
        sink = KubernetesEventSink(
            transport=apiserver.client("capwatch-agent"), node_name=NODE, clock=SystemClock()
        )
        sink.post(
            PodEvent(
                pod=PodRef(namespace="ns", name=name, uid=f"uid-{len(name)}"),
                type=PodEventType.WARNING,
                reason="PowerCapFailed",
                message="GPU 0: write failed",
            )
        )
    selector = (
        "involvedObject.kind=Pod,involvedObject.name=trainer-0,"
        "involvedObject.namespace=ns,involvedObject.uid=uid-9"
    )
    (short,) = _names(apiserver, "/api/v1/namespaces/ns/events", selector)
    assert short.startswith("trainer-0.")
    assert len(short) == len("trainer-0.") + 5
    (cut,) = _names(apiserver, "/api/v1/events", f"involvedObject.name={long_name}")
    assert cut.startswith("p" * 58)
    assert len(cut) == 63
    created = {e["metadata"]["name"]: e for e in apiserver.events("ns")}
    assert created[short]["source"] == {"component": "capwatch-agent", "host": NODE}
    assert created[short]["lastTimestamp"].endswith("Z")


EVENT_SELECTIONS = [
    ("reason=R1", 1),
    ("type=Normal", 1),
    ("source=capwatch-controller", 2),
    ("reportingComponent=capwatch.io/controller", 0),
    ("metadata.name=n1.a", 1),
    ("metadata.namespace=default,involvedObject.apiVersion=v1", 2),
    ("involvedObject.resourceVersion=,involvedObject.fieldPath=", 2),
    ("involvedObject.name!=n1", 0),
]


def test_event_field_selectors(apiserver: ApiServer) -> None:
    """The real server's field labels for Events select as it selects them (each of
    EVENT_SELECTIONS: selector, Events selected)."""
    client = apiserver.client()
    for name, reason, kind in (("n1.a", "R1", "Warning"), ("n1.b", "R2", "Normal")):
        body = {
            "metadata": {"name": name},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "n1"},
            "reason": reason,
            "message": "m",
            "type": kind,
            "source": {"component": "capwatch-controller"},
            "firstTimestamp": "2025-03-01T10:00:00Z",
            "lastTimestamp": "2025-03-01T10:00:00Z",
            "count": 1,
        }
        assert call(client, "POST", "/api/v1/namespaces/default/events", body=body).status == 201
    got = {sel: len(_names(apiserver, "/api/v1/events", sel)) for sel, _ in EVENT_SELECTIONS}
    assert got == dict(EVENT_SELECTIONS)


def test_unsupported_event_field_is_400(apiserver: ApiServer) -> None:
    """A field the real server does not index for Events (count) answers 400."""
    query = urlencode({"fieldSelector": "count=1"})
    answer = call(apiserver.client(), "GET", f"/api/v1/events?{query}")
    assert (answer.status, answer.reason) == (400, "BadRequest")


def test_events_are_watched_by_field_selector(apiserver: ApiServer) -> None:
    """A watch of a namespace's Events by involvedObject sees the matching new Event as
    ADDED (kind Event) and nothing of another node's."""
    start = apiserver.resource_version()
    client = apiserver.client()
    watch = Watch(
        client,
        "/api/v1/namespaces/default/events",
        {"resourceVersion": start, "fieldSelector": "involvedObject.name=n1"},
    )
    try:
        for node in ("n2", "n1"):
            body = {
                "metadata": {"generateName": f"{node}."},
                "involvedObject": {"kind": "Node", "name": node, "uid": node},
                "reason": "R",
                "message": "m",
                "type": "Normal",
            }
            posted = call(client, "POST", "/api/v1/namespaces/default/events", body=body)
            assert posted.status == 201
        event = watch.next()
    finally:
        watch.close()
    assert (event["type"], event["object"]["kind"]) == ("ADDED", "Event")
    assert event["object"]["involvedObject"]["name"] == "n1"
