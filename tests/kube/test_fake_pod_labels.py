"""The fake API server's pods by label selector in a namespace: the controller's agent
discovery (list and watch), through raw calls as controller/kube.py makes them, on the
fake and on a real kube-apiserver (``apiserver``)."""

from __future__ import annotations

from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.kube.rawapi import Watch, call
from tests.kube.servers import ApiServer
from tests.kube.support import NODE, OTHER_NODE

PODS = "/api/v1/namespaces/capwatch/pods"
AGENT = {"app.kubernetes.io/name": "capwatch", "app.kubernetes.io/component": "agent"}


def _names(answer_items: list[dict[str, object]]) -> list[str]:
    return [str(item["metadata"]["name"]) for item in answer_items]  # type: ignore[index]


def test_label_selected_list_carries_what_discovery_reads(apiserver: ApiServer) -> None:
    """A namespaced list by labelSelector returns only that namespace's matching pods,
    each with labels, uid, creationTimestamp, deletionTimestamp (when terminating),
    spec.nodeName, status.podIP/podIPs and status.phase as they were written."""
    made = apiserver.add_pod("capwatch", "agent-a", node=NODE, labels=AGENT, pod_ip="10.0.0.5")
    apiserver.add_pod("capwatch", "agent-b", node=OTHER_NODE, labels=AGENT)
    terminating = apiserver.terminate_pod("capwatch", "agent-b")
    apiserver.add_pod("capwatch", "other", node=NODE, labels={"app.kubernetes.io/name": "x"})
    apiserver.add_pod("elsewhere", "agent-c", node=NODE, labels=AGENT)
    written = int(apiserver.resource_version())

    answer = call(
        apiserver.client("capwatch-controller/r0"),
        "GET",
        PODS,
        query={
            "labelSelector": "app.kubernetes.io/name=capwatch,app.kubernetes.io/component==agent"
        },
    )
    assert answer.status == 200
    assert answer.body["kind"] == "PodList"
    assert int(answer.rv) >= written
    a, b = answer.body["items"]
    assert a["metadata"]["labels"] == AGENT
    assert (a["metadata"]["uid"], a["metadata"]["creationTimestamp"]) == (
        made["metadata"]["uid"],
        made["metadata"]["creationTimestamp"],
    )
    assert "deletionTimestamp" not in a["metadata"]
    assert a["spec"]["nodeName"] == NODE
    assert (a["status"]["phase"], a["status"]["podIP"], a["status"]["podIPs"]) == (
        "Running",
        "10.0.0.5",
        [{"ip": "10.0.0.5"}],
    )
    assert b["metadata"]["deletionTimestamp"] == terminating["metadata"]["deletionTimestamp"]
    assert b["metadata"]["deletionGracePeriodSeconds"] == 30
    assert "podIP" not in b["status"]


SELECTIONS = [
    ("tier=gpu", ["a"]),
    ("tier==gpu", ["a"]),
    ("tier!=gpu", ["b", "c"]),  # true also where the label is absent
    ("tier", ["a", "b"]),
    ("!tier", ["c"]),
    ("tier, zone=z1", ["a"]),  # spaces around a requirement are allowed
    (" tier = gpu ", ["a"]),  # and around its operator
    ("tier=", []),  # an empty value is a value
    ("tier!=", ["a", "b", "c"]),
    ("example.com/team=ml,tier=gpu", ["a"]),
    ("", ["a", "b", "c"]),
    ("tier in (gpu,cpu)", ["a", "b"]),
    ("tier in (gpu, cpu)", ["a", "b"]),
    ("tier notin (gpu)", ["b", "c"]),  # true also where the label is absent
    ("tier in ()", []),
    ("tier notin ()", ["a", "b", "c"]),
    ("tier in (x,)", []),  # an empty value in a set
    ("count>1", ["a"]),  # integers only: a label that is none never matches
    ("count<2", ["b"]),
    ("!tier,tier", []),
]
MALFORMED = [
    "count>x",  # > and < take integers
    "tier in gpu",  # a set needs its parentheses
    "tier=gpu,",  # an empty requirement
    "Bad Key=x",
    "tier=bad value",
    "tier=a=b",
    "-tier=x",
    "tier=" + "v" * 64,  # values are at most 63 characters
    "x" * 64,  # and so are names
    "UPPER.example.com/x=y",  # a prefix is a lower-case DNS subdomain
    "a/b/c=d",
]


def test_label_selectors_select_as_the_real_server_selects(apiserver: ApiServer) -> None:
    """k=v, k==v, k!=v, k and !k, set-based in and notin, k>n and k<n, comma-joined,
    select as the real server selects (each of SELECTIONS: selector, pods selected)."""
    apiserver.add_pod(
        "capwatch",
        "a",
        node=NODE,
        labels={"tier": "gpu", "zone": "z1", "example.com/team": "ml", "count": "3"},
    )
    apiserver.add_pod("capwatch", "b", node=NODE, labels={"tier": "cpu", "count": "1"})
    apiserver.add_pod("capwatch", "c", node=NODE, labels={"count": "many"})
    client = apiserver.client()
    got = {
        selector: _names(call(client, "GET", PODS, query={"labelSelector": selector}).body["items"])
        for selector, _ in SELECTIONS
    }
    assert got == dict(SELECTIONS)


def test_malformed_label_selectors_are_400(apiserver: ApiServer) -> None:
    """Anything outside the grammar, or a malformed key or value (each of MALFORMED),
    answers 400 BadRequest with a Status body, for lists and watches alike."""
    client = apiserver.client()
    for selector in MALFORMED:
        listed = call(client, "GET", PODS, query={"labelSelector": selector})
        watched = call(client, "GET", PODS, query={"labelSelector": selector, "watch": "true"})
        assert (listed.status, listed.reason) == (400, "BadRequest"), selector
        assert (watched.status, watched.reason) == (400, "BadRequest"), selector


def test_label_selected_watch_sends_deleted_and_added_as_pods_leave_and_join(
    apiserver: ApiServer,
) -> None:
    """A watch by labelSelector sees a pod as ADDED when it starts matching and as
    DELETED (its last matching state, at the version of the change) when it stops;
    changes to a matching pod (its status, podIP, deletionTimestamp) are MODIFIED, and
    its deletion MODIFIED then DELETED; other namespaces' pods never show."""
    selector = "app.kubernetes.io/name=capwatch"
    start = apiserver.resource_version()
    apiserver.add_pod("capwatch", "p", node=NODE, labels=AGENT)
    apiserver.add_pod("elsewhere", "q", node=NODE, labels=AGENT)
    apiserver.set_pod_ip("capwatch", "p", "10.0.0.7")
    left = apiserver.set_pod_labels("capwatch", "p", {"app.kubernetes.io/name": "renamed"})
    apiserver.set_pod_labels("capwatch", "p", AGENT)
    apiserver.terminate_pod("capwatch", "p")
    apiserver.delete_pod("capwatch", "p")
    watch = Watch(
        apiserver.client(),
        PODS,
        {"labelSelector": selector, "resourceVersion": start, "timeoutSeconds": "5"},
    )
    try:
        events = [watch.next() for _ in range(8)]
    finally:
        watch.close()
    assert [e["type"] for e in events] == [
        "ADDED",
        "MODIFIED",  # its status: Running
        "MODIFIED",  # its podIP
        "DELETED",
        "ADDED",
        "MODIFIED",  # terminating
        "MODIFIED",  # deleted: the deletionTimestamp moved to now
        "DELETED",
    ]
    assert {e["object"]["metadata"]["namespace"] for e in events} == {"capwatch"}
    assert all(e["object"]["kind"] == "Pod" for e in events)
    assert events[2]["object"]["status"]["podIP"] == "10.0.0.7"
    gone = events[3]["object"]
    assert gone["metadata"]["labels"] == AGENT  # the last state the watcher could see
    assert gone["metadata"]["resourceVersion"] == left["metadata"]["resourceVersion"]
    assert "deletionTimestamp" in events[5]["object"]["metadata"]


def test_update_pod_keeps_existing_callers_working(kube_apiserver: FakeKubeApiServer) -> None:
    """The fake's own test helpers (no server semantics): the older add_pod/update_pod
    arguments still work; "" removes nodeName and podIP,
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
