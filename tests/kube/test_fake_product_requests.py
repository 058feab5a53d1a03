"""The product's own list+watch requests, end to end, on the fake and on a real
kube-apiserver (``apiserver``): the agent's pod view (pods by ``spec.nodeName``, paged,
then watched with bookmarks from the list's resourceVersion) and the controller's
discovery requests (agent pods by label in a namespace, GPU nodes by label), each
driven by the informer exactly as in production."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from capwatch.agent.kube.podview import PodInformer
from capwatch.kit.clock import SystemClock
from capwatch.kube.client import CollectionRequests
from capwatch.kube.informer import Informer, WatchPolicy
from tests.kube.servers import ApiServer
from tests.kube.support import NODE, OTHER_NODE, is_synced, kube_pod_view, names, wait_until

AGENT = {"app.kubernetes.io/name": "capwatch", "app.kubernetes.io/component": "agent"}
AGENT_PODS = "/api/v1/namespaces/capwatch/pods"
GPU = {"nvidia.com/gpu.present": "true"}
POLICY = WatchPolicy(stale_after=30, silence_bound=6, backoff_initial=0.05, backoff_max=0.5)


@pytest.fixture
def view(apiserver: ApiServer) -> Iterator[PodInformer]:
    """The agent's pod view of ``node-a``, paging its list two pods at a time."""
    pod_view = kube_pod_view(
        node_name=NODE,
        transport=apiserver.client("capwatch-agent/node-a"),
        clock=SystemClock(),
        policy=WatchPolicy(stale_after=30, silence_bound=6, page_size=2),
        rng=random.Random(7),
    )
    yield pod_view
    pod_view.close()


def test_the_agents_pod_view_lists_then_follows_its_node(
    apiserver: ApiServer, view: PodInformer
) -> None:
    """The pod view's paged LIST of its node's pods (three pages of two) and its WATCH
    from the list's resourceVersion: pods added, annotated, bound onto the node and
    deleted show up; other nodes' pods never do; no relist and no error meanwhile."""
    for i in range(5):
        apiserver.add_pod("ns", f"p{i}", node=NODE)
    apiserver.add_pod("ns", "elsewhere", node=OTHER_NODE)
    view.start()
    first = {f"ns/p{i}" for i in range(5)}
    wait_until(lambda: is_synced(view) and names(view) == first, 20, "the first list")
    assert view.stats().list_requests == 3

    apiserver.add_pod("other", "new", node=NODE)
    apiserver.add_pod("ns", "pending")
    apiserver.bind_pod("ns", "pending", NODE)
    apiserver.set_pod_annotations("ns", "p1", {"capwatch.io/gpu-power-limit": "300"})
    apiserver.delete_pod("ns", "p0")
    wanted = {f"ns/p{i}" for i in range(1, 5)} | {"other/new", "ns/pending"}
    wait_until(lambda: names(view) == wanted, 20, "the watch's changes")
    annotations = {str(p.ref): dict(p.annotations) for p in view.snapshot().pods.values()}
    assert annotations["ns/p1"] == {"capwatch.io/gpu-power-limit": "300"}
    stats = view.stats()
    assert (stats.list_requests, stats.relists, stats.errors) == (3, 0, 0)


class _Recorder:
    """A Store that keeps the objects by name, and every change as it came."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.objects: dict[str, Mapping[str, Any]] = {}
        self.changes: list[tuple[str, str]] = []

    def replace(self, objects: list[Mapping[str, Any]]) -> None:
        with self.lock:
            self.objects = {str(o["metadata"]["name"]): o for o in objects}

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        with self.lock:
            name = str(obj["metadata"]["name"])
            self.changes.append((kind, name))
            if kind == "DELETED":
                self.objects.pop(name, None)
            else:
                self.objects[name] = obj

    def names(self) -> set[str]:
        with self.lock:
            return set(self.objects)


def _informer(apiserver: ApiServer, path: str, selector: str, store: _Recorder) -> Informer:
    requests = CollectionRequests(
        apiserver.client("capwatch-controller/r0"), path=path, label_selector=selector
    )
    informer = Informer(
        what=path, requests=requests, store=store, clock=SystemClock(), policy=POLICY
    )
    informer.start(f"test-{path}")
    return informer


def test_the_controllers_discovery_lists_and_watches_by_label(apiserver: ApiServer) -> None:
    """Discovery's CollectionRequests through the informer: agent pods by label in the
    chart's namespace and GPU nodes by label, listed then watched; a pod whose label
    goes is DELETED for it, a node labelled a GPU node is ADDED; the others never
    show."""
    apiserver.add_pod("capwatch", "agent-a", node=NODE, labels=AGENT, pod_ip="10.0.0.5")
    apiserver.add_pod("capwatch", "not-agent", node=NODE)
    apiserver.add_pod("elsewhere", "agent-x", node=NODE, labels=AGENT)
    apiserver.add_node(NODE, labels=GPU)
    apiserver.add_node("cpu-0")
    pods, nodes = _Recorder(), _Recorder()
    informers = [
        _informer(apiserver, AGENT_PODS, "app.kubernetes.io/name=capwatch", pods),
        _informer(apiserver, "/api/v1/nodes", "nvidia.com/gpu.present=true", nodes),
    ]
    try:
        wait_until(lambda: all(i.sync_problem() is None for i in informers), 20, "the lists")
        assert (pods.names(), nodes.names()) == ({"agent-a"}, {NODE})
        apiserver.add_pod("capwatch", "agent-b", node=OTHER_NODE, labels=AGENT)
        apiserver.set_pod_labels("capwatch", "agent-a", {"app.kubernetes.io/name": "old"})
        apiserver.set_node_labels("cpu-0", GPU)
        wait_until(lambda: pods.names() == {"agent-b"}, 20, "the pod watch")
        wait_until(lambda: nodes.names() == {NODE, "cpu-0"}, 20, "the node watch")
    finally:
        for informer in informers:
            informer.close()
    assert ("DELETED", "agent-a") in pods.changes
    assert ("ADDED", "cpu-0") in nodes.changes
    assert all(name != "not-agent" for _, name in pods.changes)
