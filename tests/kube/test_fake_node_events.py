"""The fake API server's Events for cluster-scoped objects: Node Events in ``default``,
named as sent, validated as a real 1.37 server validates a core/v1 Event without an
eventTime, on the fake and on a real kube-apiserver (``apiserver``). The write log
with the User-Agent that posted each is the fake's alone (``kube_apiserver``)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.kube.conftest import ClientFactory
from tests.kube.rawapi import call
from tests.kube.servers import ApiServer

EVENTS = "/api/v1/namespaces/default/events"


def _node_event(name: str = "n1.17a2b3c4d5e6f708", **metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": "default", **metadata},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "n1"},
        "reason": "GPUPowerCapNotEnforced",
        "message": "GPU 3: cap write failed",
        "type": "Warning",
        "source": {"component": "capwatch-controller"},
        "firstTimestamp": "2025-03-01T10:00:00Z",
        "lastTimestamp": "2025-03-01T10:00:00Z",
        "count": 1,
    }


def test_a_node_event_in_default_is_created_as_named(apiserver: ApiServer) -> None:
    """A Node's Event (involvedObject without a namespace) is accepted in ``default``:
    201 with the name it was sent with, a uid, a resourceVersion like any write, and
    the fields the real server fills in (eventTime null, empty reporting fields); it is
    then in the namespace's Events as answered."""
    before = int(apiserver.resource_version())
    answer = call(apiserver.client("capwatch-controller/r0"), "POST", EVENTS, body=_node_event())
    assert answer.status == 201
    assert (answer.body["kind"], answer.body["apiVersion"]) == ("Event", "v1")
    assert answer.body["metadata"]["name"] == "n1.17a2b3c4d5e6f708"
    assert answer.body["metadata"]["uid"]
    assert int(answer.rv) > before
    assert answer.body["involvedObject"] == _node_event()["involvedObject"]
    assert (
        answer.body["eventTime"],
        answer.body["reportingComponent"],
        answer.body["reportingInstance"],
    ) == (None, "", "")
    (created,) = apiserver.events("default")
    assert {"kind": "Event", "apiVersion": "v1", **created} == answer.body


def test_the_fake_logs_who_posted_each_event(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """The fake's write log (a real server's nearest is its audit log): server time,
    namespace, name and User-Agent of each created Event, and the request's kind."""
    call(make_client("capwatch-controller/r0"), "POST", EVENTS, body=_node_event())
    (write,) = kube_apiserver.event_writes()
    assert (write.namespace, write.name, write.user_agent) == (
        "default",
        "n1.17a2b3c4d5e6f708",
        "capwatch-controller/r0",
    )
    assert write.event == kube_apiserver.events()[0]
    assert [r.kind for r in kube_apiserver.requests()] == ["event"]


@pytest.mark.parametrize(
    ("namespace", "body", "status", "reason"),
    [
        ("capwatch", _node_event(namespace="capwatch"), 422, "Invalid"),  # Node not in default
        ("default", _node_event(namespace="capwatch"), 400, "BadRequest"),  # body vs URL
        ("default", {**_node_event(), "metadata": {}}, 422, "Invalid"),  # no name at all
        ("default", _node_event("n1/x"), 422, "Invalid"),  # not a path segment
        ("default", {**_node_event(), "involvedObject": "n1"}, 400, "BadRequest"),
        ("default", {**_node_event(), "count": "1"}, 400, "BadRequest"),
        ("default", {**_node_event(), "firstTimestamp": "2025-03-01 10:00:00"}, 400, "BadRequest"),
        ("default", {**_node_event(), "eventTime": "2025-03-01T10:00:00Z"}, 400, "BadRequest"),
    ],
)
def test_refused_events(
    apiserver: ApiServer, namespace: str, body: dict[str, Any], status: int, reason: str
) -> None:
    """A cluster-scoped object's Event outside ``default`` is 422; a body namespace at
    odds with the URL 400; neither name nor generateName, or a name with a ``/``, 422;
    a malformed involved object, a string count, a time that is not RFC 3339, an
    eventTime that is not MicroTime 400. Nothing is created."""
    path = f"/api/v1/namespaces/{namespace}/events"
    answer = call(apiserver.client(), "POST", path, body=body)
    assert (answer.status, answer.reason) == (status, reason)
    assert apiserver.events("default") == []
    assert apiserver.events("capwatch") == []


def test_names_longer_than_a_dns_subdomain_are_accepted(apiserver: ApiServer) -> None:
    """The legacy validation of a core/v1 Event without an eventTime does not hold its
    name to a DNS subdomain: 300 characters, upper case and underscores are all taken
    (so the controller's ``<node>.<hex>`` of a 253-character node name is too)."""
    client = apiserver.client()
    for name in ("n" * 300, "Upper.Case_Name"):
        answer = call(client, "POST", EVENTS, body=_node_event(name))
        assert (answer.status, answer.body["metadata"]["name"]) == (201, name)
    assert {e["metadata"]["name"] for e in apiserver.events("default")} == {
        "n" * 300,
        "Upper.Case_Name",
    }


def test_timestamps_are_stored_as_whole_seconds_in_utc(apiserver: ApiServer) -> None:
    """firstTimestamp and lastTimestamp are ``metav1.Time``: any RFC 3339 fraction and
    offset are taken, and stored (and answered) as whole seconds in UTC."""
    body = {
        **_node_event(),
        "firstTimestamp": "2025-03-01T10:00:00.123456Z",
        "lastTimestamp": "2025-03-01T12:00:05+02:00",
    }
    answer = call(apiserver.client(), "POST", EVENTS, body=body)
    assert answer.status == 201
    assert (answer.body["firstTimestamp"], answer.body["lastTimestamp"]) == (
        "2025-03-01T10:00:00Z",
        "2025-03-01T10:00:05Z",
    )
    (created,) = apiserver.events("default")
    assert created["lastTimestamp"] == "2025-03-01T10:00:05Z"


def test_a_name_is_unique_in_its_namespace(apiserver: ApiServer) -> None:
    """A second Event with the same name is 409 AlreadyExists (two transitions stamped
    the same instant would collide on a real server too); generateName always gets a
    fresh name: the prefix and five random characters, a prefix longer than 58 cut to
    58 (generated names are at most 63 characters)."""
    client = apiserver.client()
    assert call(client, "POST", EVENTS, body=_node_event()).status == 201
    again = call(client, "POST", EVENTS, body=_node_event())
    assert (again.status, again.reason) == (409, "AlreadyExists")
    generated = [
        call(client, "POST", EVENTS, body=_node_event(name="", generateName="n1.")).body
        for _ in range(2)
    ]
    names = {g["metadata"]["name"] for g in generated}
    assert len(names) == 2
    assert all(name.startswith("n1.") and len(name) == 8 for name in names)
    long = call(client, "POST", EVENTS, body=_node_event(name="", generateName="g" * 70))
    assert long.status == 201
    assert long.body["metadata"]["name"].startswith("g" * 58)
    assert len(long.body["metadata"]["name"]) == 63
    assert len(apiserver.events("default")) == 4
