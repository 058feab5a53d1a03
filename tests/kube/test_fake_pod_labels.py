"""The fake API server's pods by label selector in a namespace: the controller's agent
discovery (list and watch), through raw calls as controller/kube.py makes them."""

from __future__ import annotations

import pytest

from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.kube.conftest import ClientFactory
from tests.kube.rawapi import Watch, call
from tests.kube.support import NODE, OTHER_NODE

PODS = "/api/v1/namespaces/capwatch/pods"
AGENT = {"app.kubernetes.io/name": "capwatch", "app.kubernetes.io/component": "agent"}


def _names(answer_items: list[dict[str, object]]) -> list[str]:
    return [str(item["metadata"]["name"]) for item in answer_items]  # type: ignore[index]


def test_label_selected_list_carries_what_discovery_reads(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """A namespaced list by labelSelector returns only that namespace's matching pods,
    each with labels, uid, creationTimestamp, deletionTimestamp (when terminating),
    spec.nodeName, status.podIP/podIPs and status.phase as the test set them."""
    kube_apiserver.add_pod(
        "capwatch",
        "agent-a",
        node=NODE,
        labels=AGENT,
        pod_ip="10.0.0.5",
        uid="uid-a",
        created="2025-03-01T10:00:00Z",
    )
    kube_apiserver.add_pod(
        "capwatch",
        "agent-b",
        node=OTHER_NODE,
        labels=AGENT,
        deletion_timestamp="2025-03-01T11:00:00Z",
    )
    kube_apiserver.add_pod("capwatch", "other", node=NODE, labels={"app.kubernetes.io/name": "x"})
    kube_apiserver.add_pod("elsewhere", "agent-c", node=NODE, labels=AGENT)
    client = make_client("capwatch-controller/r0")

    answer = call(
        client,
        "GET",
        PODS,
        query={
            "labelSelector": "app.kubernetes.io/name=capwatch,app.kubernetes.io/component==agent"
        },
    )
    assert answer.status == 200
    assert answer.body["kind"] == "PodList"
    assert answer.rv == str(kube_apiserver.resource_version)
    a, b = answer.body["items"]
    assert a["metadata"]["labels"] == AGENT
    assert (a["metadata"]["uid"], a["metadata"]["creationTimestamp"]) == (
        "uid-a",
        "2025-03-01T10:00:00Z",
    )
    assert "deletionTimestamp" not in a["metadata"]
    assert a["spec"]["nodeName"] == NODE
    assert a["status"] == {"phase": "Running", "podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}]}
    assert b["metadata"]["deletionTimestamp"] == "2025-03-01T11:00:00Z"
    assert "podIP" not in b["status"]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("tier=gpu", ["a"]),
        ("tier==gpu", ["a"]),
        ("tier!=gpu", ["b", "c"]),  # true also where the label is absent
        ("tier", ["a", "b"]),
        ("!tier", ["c"]),
        ("tier, zone=z1", ["a"]),  # spaces around a requirement are allowed
        ("tier=", []),  # an empty value is a value
        ("example.com/team=ml,tier=gpu", ["a"]),
        ("", ["a", "b", "c"]),
    ],
)
def test_equality_based_label_selectors(
    kube_apiserver: FakeKubeApiServer,
    make_client: ClientFactory,
    selector: str,
    expected: list[str],
) -> None:
    """k=v, k==v, k!=v, k and !k, comma-joined, select as the real server selects."""
    kube_apiserver.add_pod(
        "capwatch", "a", node=NODE, labels={"tier": "gpu", "zone": "z1", "example.com/team": "ml"}
    )
    kube_apiserver.add_pod("capwatch", "b", node=NODE, labels={"tier": "cpu"})
    kube_apiserver.add_pod("capwatch", "c", node=NODE)
    answer = call(make_client("t"), "GET", PODS, query={"labelSelector": selector})
    assert answer.status == 200
    assert _names(answer.body["items"]) == expected


@pytest.mark.parametrize(
    "selector",
    [
        "tier in (gpu,cpu)",  # set-based: not modelled
        "tier notin (gpu)",
        "count>1",
        "tier=gpu,",  # an empty requirement
        "Bad Key=x",
        "tier=bad value",
        "-tier=x",
        "tier=" + "v" * 64,  # values are at most 63 characters
        "UPPER.example.com/x=y",  # a prefix is a lower-case DNS subdomain
    ],
)
def test_unsupported_label_selectors_are_400(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory, selector: str
) -> None:
    """Anything outside the equality-based grammar, or a malformed key or value, answers
    400 BadRequest with a Status body, for lists and watches alike."""
    client = make_client("t")
    listed = call(client, "GET", PODS, query={"labelSelector": selector})
    watched = call(client, "GET", PODS, query={"labelSelector": selector, "watch": "true"})
    assert (listed.status, listed.reason) == (400, "BadRequest")
    assert (watched.status, watched.reason) == (400, "BadRequest")


def test_label_selected_watch_sends_deleted_and_added_as_pods_leave_and_join(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """A watch by labelSelector sees a pod as ADDED when it starts matching and as
    DELETED (its last matching state, at the version of the change) when it stops;
    changes to a matching pod (podIP, deletionTimestamp) are MODIFIED; other
    namespaces' pods never show."""
    selector = "app.kubernetes.io/name=capwatch"
    start = str(kube_apiserver.resource_version)
    kube_apiserver.add_pod("capwatch", "p", node=NODE, labels=AGENT)
    kube_apiserver.add_pod("elsewhere", "q", node=NODE, labels=AGENT)
    kube_apiserver.update_pod("capwatch", "p", pod_ip="10.0.0.7")
    kube_apiserver.update_pod("capwatch", "p", labels={"app.kubernetes.io/name": "renamed"})
    left_at = str(kube_apiserver.resource_version)
    kube_apiserver.update_pod("capwatch", "p", labels=AGENT)
    kube_apiserver.update_pod("capwatch", "p", deletion_timestamp="2025-03-01T11:00:00Z")
    kube_apiserver.delete_pod("capwatch", "p")
    watch = Watch(
        make_client("t"),
        PODS,
        {"labelSelector": selector, "resourceVersion": start, "timeoutSeconds": "5"},
    )
    try:
        events = [watch.next() for _ in range(6)]
    finally:
        watch.close()
    assert [e["type"] for e in events] == [
        "ADDED",
        "MODIFIED",
        "DELETED",
        "ADDED",
        "MODIFIED",
        "DELETED",
    ]
    assert {e["object"]["metadata"]["namespace"] for e in events} == {"capwatch"}
    assert all(e["object"]["kind"] == "Pod" for e in events)
    assert events[1]["object"]["status"]["podIP"] == "10.0.0.7"
    left = events[2]["object"]
    assert left["metadata"]["labels"] == AGENT  # the last state the watcher could see
    assert left["metadata"]["resourceVersion"] == left_at
    assert events[4]["object"]["metadata"]["deletionTimestamp"] == "2025-03-01T11:00:00Z"


def test_update_pod_keeps_existing_callers_working(kube_apiserver: FakeKubeApiServer) -> None:
    """The older add_pod/update_pod arguments still work; "" removes nodeName and podIP,
    and labels are replaced wholesale (an empty map leaves none, as the real JSON does)."""
    kube_apiserver.add_pod(
        "ns", "p", node=NODE, annotations={"a": "1"}, labels={"x": "1"}, pod_ip="10.0.0.1"
    )
    pod = kube_apiserver.update_pod("ns", "p", node="", pod_ip="", labels={}, phase="Succeeded")
    assert "nodeName" not in pod["spec"]
    assert "podIP" not in pod["status"]
    assert "labels" not in pod["metadata"]
    assert pod["metadata"]["annotations"] == {"a": "1"}
    assert pod["status"]["phase"] == "Succeeded"
    assert kube_apiserver.pod("ns", "p") == pod
