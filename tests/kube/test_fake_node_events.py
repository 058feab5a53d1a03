"""The fake API server's Events for cluster-scoped objects: Node Events in ``default``,
named as sent, with the User-Agent that posted them; the real server's refusals."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.kube.conftest import ClientFactory
from tests.kube.rawapi import call


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


def test_a_node_event_in_default_is_created_as_named(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """A Node's Event (involvedObject without a namespace) is accepted in ``default``:
    201 with the name it was sent with; events() lists it and event_writes() adds the
    server time and the User-Agent; it takes a resourceVersion like any write."""
    before = kube_apiserver.resource_version
    answer = call(
        make_client("capwatch-controller/r0"),
        "POST",
        "/api/v1/namespaces/default/events",
        body=_node_event(),
    )
    assert answer.status == 201
    assert answer.body["metadata"]["name"] == "n1.17a2b3c4d5e6f708"
    assert int(answer.rv) > before
    (created,) = kube_apiserver.events()
    assert created == answer.body
    assert created["involvedObject"]["kind"] == "Node"
    (write,) = kube_apiserver.event_writes()
    assert (write.namespace, write.name, write.user_agent) == (
        "default",
        "n1.17a2b3c4d5e6f708",
        "capwatch-controller/r0",
    )
    assert [r.kind for r in kube_apiserver.requests()] == ["event"]


@pytest.mark.parametrize(
    ("namespace", "body", "status", "reason"),
    [
        ("capwatch", _node_event(namespace="capwatch"), 422, "Invalid"),  # Node not in default
        ("default", _node_event(namespace="capwatch"), 400, "BadRequest"),  # body vs URL
        ("default", {**_node_event(), "metadata": {}}, 422, "Invalid"),  # no name at all
        ("default", {**_node_event(), "involvedObject": "n1"}, 400, "BadRequest"),
    ],
)
def test_refused_events(
    kube_apiserver: FakeKubeApiServer,
    make_client: ClientFactory,
    namespace: str,
    body: dict[str, Any],
    status: int,
    reason: str,
) -> None:
    """A cluster-scoped object's Event outside ``default`` is 422; a body namespace at
    odds with the URL 400; neither name nor generateName 422; a malformed involved object
    400. Nothing is created."""
    answer = call(make_client("t"), "POST", f"/api/v1/namespaces/{namespace}/events", body=body)
    assert (answer.status, answer.reason) == (status, reason)
    assert kube_apiserver.events() == []


def test_a_name_is_unique_in_its_namespace(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """A second Event with the same name is 409 AlreadyExists (two transitions stamped
    the same instant would collide on a real server too); generateName always gets a
    fresh name."""
    client = make_client("t")
    path = "/api/v1/namespaces/default/events"
    assert call(client, "POST", path, body=_node_event()).status == 201
    again = call(client, "POST", path, body=_node_event())
    assert (again.status, again.reason) == (409, "AlreadyExists")
    generated = [
        call(client, "POST", path, body=_node_event(name="", generateName="n1.")) for _ in range(2)
    ]
    names = {a.body["metadata"]["name"] for a in generated}
    assert len(names) == 2
    assert all(name.startswith("n1.") for name in names)
    assert len(kube_apiserver.events()) == 3
