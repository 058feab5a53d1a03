"""410 Gone, on the fake and on a real kube-apiserver whose history a compaction removes
(``expiring_apiserver``: the real one serves every read from etcd, so a compaction of
etcd expires versions at once; with its watch cache on it would go on serving them from
the cache's own history, which no test can empty on demand).

What the informers rely on: a watch from a resourceVersion older than the retained
history is answered 200 with a single ERROR event carrying a 410 ``Expired`` Status
(the real server's form; the client's own Watch raises ApiException(410) for it), and
a continue token or an exact list from before the compaction is an HTTP 410. The HTTP
410 form of a watch is the fake's alone (``gone_mode``): older servers and proxies.
"""

from __future__ import annotations

import json

import kubernetes.client
import kubernetes.watch
import pytest

from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.kube.conftest import ClientFactory
from tests.kube.rawapi import Watch, call
from tests.kube.servers import ApiServer
from tests.kube.support import NODE


def _expired(server: ApiServer) -> str:
    """A resourceVersion the server no longer has the history after."""
    old = server.resource_version()
    server.add_node("n1")
    server.add_pod("ns", "a", node=NODE)
    server.compact()
    return old


@pytest.mark.parametrize("path", ["/api/v1/pods", "/api/v1/nodes"])
def test_a_watch_from_before_the_history_is_an_error_event(
    expiring_apiserver: ApiServer, path: str
) -> None:
    """Pods and Nodes alike: 200, then one ERROR event whose object is a 410 Expired
    Status, then the end of the stream."""
    old = _expired(expiring_apiserver)
    query = {"resourceVersion": old, "timeoutSeconds": "5"}
    watch = Watch(expiring_apiserver.client(), path, query)
    try:
        (event,) = watch.rest()
    finally:
        watch.close()
    assert event["type"] == "ERROR"
    status = event["object"]
    assert (status["kind"], status["apiVersion"], status["status"]) == ("Status", "v1", "Failure")
    assert (status["code"], status["reason"]) == (410, "Expired")


def test_the_clients_watch_raises_410(expiring_apiserver: ApiServer) -> None:
    """kubernetes.watch.Watch turns that ERROR event into ApiException(410)."""
    old = _expired(expiring_apiserver)
    core = kubernetes.client.CoreV1Api(expiring_apiserver.library_client())
    with pytest.raises(kubernetes.client.ApiException) as gone:
        list(
            kubernetes.watch.Watch().stream(
                core.list_pod_for_all_namespaces, resource_version=old, timeout_seconds=5
            )
        )
    assert gone.value.status == 410


@pytest.mark.parametrize("path", ["/api/v1/namespaces/ns/pods", "/api/v1/nodes"])
def test_continue_and_exact_lists_from_before_the_history_are_410(
    expiring_apiserver: ApiServer, path: str
) -> None:
    """A continue token of a list taken before the compaction, and a list at exactly a
    resourceVersion from before it, answer HTTP 410 Expired."""
    for name in ("p", "q"):
        expiring_apiserver.add_node(name)
        expiring_apiserver.add_pod("ns", name, node=NODE)
    client = expiring_apiserver.client()
    page = call(client, "GET", path, query={"limit": "1"})
    assert page.body["metadata"]["continue"]
    expiring_apiserver.add_node("r")  # the page's version is then older than the newest
    expiring_apiserver.compact()
    token = page.body["metadata"]["continue"]
    expired = call(client, "GET", path, query={"limit": "1", "continue": token})
    assert (expired.status, expired.reason) == (410, "Expired")
    exact = call(
        client, "GET", path, query={"resourceVersion": page.rv, "resourceVersionMatch": "Exact"}
    )
    assert (exact.status, exact.reason) == (410, "Expired")


@pytest.mark.parametrize("path", ["/api/v1/pods", "/api/v1/nodes"])
def test_an_expired_watch_as_an_http_410(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory, path: str
) -> None:
    """Fault injection: the real server cannot do this on demand (1.37 answers a watch
    it has authorized with an ERROR event). With gone_mode "http" the fake answers the
    expired watch with an HTTP 410 Expired Status, for pods and Nodes alike, which the
    client's Watch also raises as ApiException(410)."""
    kube_apiserver.gone_mode = "http"
    old = _expired_fake(kube_apiserver)
    client = make_client("t")
    answer = call(
        client, "GET", path, query={"resourceVersion": old, "timeoutSeconds": "1", "watch": "true"}
    )
    assert (answer.status, answer.reason) == (410, "Expired")
    library = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=kube_apiserver.url))
    core = kubernetes.client.CoreV1Api(library)
    with library, pytest.raises(kubernetes.client.ApiException) as gone:
        list(
            kubernetes.watch.Watch().stream(
                core.list_pod_for_all_namespaces, resource_version=old, timeout_seconds=1
            )
        )
    assert gone.value.status == 410
    assert json.loads(gone.value.body)["reason"] == "Expired"


def _expired_fake(fake: FakeKubeApiServer) -> str:
    old = str(fake.resource_version)
    fake.add_node("n1")
    fake.add_pod("ns", "a", node=NODE)
    fake.compact()
    return old
