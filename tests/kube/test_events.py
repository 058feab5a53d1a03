"""KubernetesEventSink: pod Events created through capwatch's transport on the fake API server."""

from __future__ import annotations

import pytest

from capwatch.agent.kube.pod_requests import KubernetesEventSink
from capwatch.agent.podevents import EventSinkError, EventType, PodEvent
from capwatch.agent.pods import PodRef
from capwatch.kit.clock import FakeClock
from capwatch.kube.transport import ApiTransport
from tests.fakes.kube_apiserver import FakeKubeApiServer

POD = PodRef(namespace="ml", name="trainer", uid="aaaaaaaa-0000-4000-8000-000000000001")
EVENT = PodEvent(pod=POD, type=EventType.WARNING, reason="PowerCapClamped", message="m")


def sink(client: ApiTransport) -> KubernetesEventSink:
    return KubernetesEventSink(
        transport=client, node_name="node-a", clock=FakeClock(), request_timeout=5.0
    )


def test_an_event_is_created_in_the_pods_namespace(
    kube_apiserver: FakeKubeApiServer, kube_api_client: ApiTransport
) -> None:
    """POST /api/v1/namespaces/ml/events with the pod as involved object; the server names it."""
    sink(kube_api_client).post(EVENT)
    (created,) = kube_apiserver.events()
    assert created["involvedObject"]["uid"] == POD.uid
    assert (created["type"], created["reason"], created["message"]) == (
        "Warning",
        "PowerCapClamped",
        "m",
    )
    assert created["metadata"]["name"].startswith("trainer.")
    assert [r.path for r in kube_apiserver.requests("event")] == ["/api/v1/namespaces/ml/events"]


@pytest.mark.parametrize("code", [403, 500, 429])
def test_a_refusal_is_an_event_sink_error(
    kube_apiserver: FakeKubeApiServer, kube_api_client: ApiTransport, code: int
) -> None:
    """Forbidden (no RBAC for events), server errors and throttling become EventSinkError,
    naming the pod; nothing is created."""
    kube_apiserver.fail_next("event", code)
    with pytest.raises(EventSinkError, match="ml/trainer"):
        sink(kube_api_client).post(EVENT)
    assert kube_apiserver.events() == []


def test_an_unreachable_api_server_is_an_event_sink_error(
    kube_apiserver: FakeKubeApiServer, kube_api_client: ApiTransport
) -> None:
    """A connection refused is reported the same way, not raised as a urllib3 error."""
    kube_apiserver.stop()
    with pytest.raises(EventSinkError):
        sink(kube_api_client).post(EVENT)
