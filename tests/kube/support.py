"""Small helpers shared by the pod-view tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from capwatch.agent.kube.pod_requests import KubernetesPodRequests
from capwatch.agent.kube.podview import PodInformer
from capwatch.kit.errors import PodViewError
from capwatch.kube.transport import ApiTransport
from tests.fakes.kube_apiserver import FakeKubeApiServer

NODE = "node-a"
OTHER_NODE = "node-b"


def wait_until(predicate: Callable[[], object], timeout: float = 5.0, what: str = "") -> None:
    """Poll ``predicate`` every few milliseconds; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(0.005)


def names(view: PodInformer) -> set[str]:
    """The ``namespace/name`` of every pod in the view's snapshot."""
    return {str(info.ref) for info in view.snapshot().pods.values()}


def is_synced(view: PodInformer) -> bool:
    try:
        view.snapshot()
    except PodViewError:
        return False
    return True


def wait_watching(server: FakeKubeApiServer, view: PodInformer) -> None:
    """Wait until the view has listed and its watch is open on the server, so that
    stream controls (drop, end, bookmark) reach it."""
    wait_until(lambda: is_synced(view) and server.open_watches == 1, what="view watching")


def kube_pod_view(
    *, node_name: str, transport: ApiTransport, namespace: str | None = None, **rest: Any
) -> PodInformer:
    """The agent's pod view over capwatch's transport, as agent/assembly.py builds it
    (``rest``: the informer's clock, policy and rng)."""
    requests = KubernetesPodRequests(transport, node_name=node_name, namespace=namespace)
    return PodInformer(node_name=node_name, requests=requests, **rest)
