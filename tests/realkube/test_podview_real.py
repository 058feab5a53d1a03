"""The agent's pod view (agent/kube) against the real API server, as the agent's own
ServiceAccount under the chart's rendered RBAC (its token bound to the agent's pod).

One LIST of the pods with ``spec.nodeName=<node>`` (every namespace under the
ClusterRole; the release namespace alone under rbac.namespaced's Role, as the
DaemonSet's --pod-namespace says), then WATCHes that the server ends every
timeoutSeconds and the view resumes from its resourceVersion with no LIST; a watch
from a resourceVersion etcd has compacted away answers 410, and the view relists.
"""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from capwatch.agent.kube.pod_requests import KubernetesPodRequests
from capwatch.agent.kube.podview import PodInformer
from capwatch.agent.pods import PodSnapshot
from capwatch.kit.clock import SystemClock
from capwatch.kit.errors import PodViewError
from capwatch.kube.client import api_transport
from capwatch.kube.informer import WatchPolicy
from tests.chart.support import Helm
from tests.controller.e2e.processes import wait_until
from tests.realkube.access import BoundPod
from tests.realkube.components import Scene, open_scene, unique
from tests.realkube.controlplane import ControlPlane

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

SILENCE_S = 5.0  # the smallest bound the agent takes: watches of 2-3 s
KEY = "capwatch.io/gpu-power-limit"
NAMESPACED = ("--set", "rbac.namespaced=true")


@contextmanager
def _view(scene: Scene, node: str) -> Iterator[tuple[PodInformer, str]]:
    """The pod view of ``node`` as the agent builds it: its ServiceAccount's token bound
    to its pod there, the namespace the DaemonSet's --pod-namespace names (none: all);
    and that agent pod's ``namespace/name`` (a pod on the node like any other)."""
    own = scene.agent_pod(node, scene.loopback.ip(9))
    config = scene.kubeconfig(
        "agent", pod=BoundPod(own["metadata"]["name"], own["metadata"]["uid"])
    )
    args = scene.release.container("DaemonSet", "agent")["args"]
    namespaces = [a.split("=", 1)[1] for a in args if a.startswith("--pod-namespace=")]
    client = api_transport(str(config), user_agent="test")
    view = PodInformer(
        node_name=node,
        requests=KubernetesPodRequests(
            client, node_name=node, namespace=namespaces[0] if namespaces else None
        ),
        clock=SystemClock(),
        policy=WatchPolicy(stale_after=5.0, silence_bound=SILENCE_S),
    )
    view.start()
    try:
        yield view, f"{scene.namespace}/{own['metadata']['name']}"
    finally:
        view.close()
        client.close()


def _synced(view: PodInformer) -> PodSnapshot | None:
    try:
        return view.snapshot()
    except PodViewError:
        return None


def _names(view: PodInformer) -> set[str] | None:
    snapshot = _synced(view)
    return None if snapshot is None else {str(p.ref) for p in snapshot.pods.values()}


def _wait_names(view: PodInformer, expected: set[str]) -> None:
    wait_until(lambda: _names(view) == expected, what=f"pods {expected} (now {_names(view)})")


def _pod_lists(plane: ControlPlane) -> dict[str, float]:
    """apiserver_request_total for pods, summed by verb (LIST, WATCH, ...), from /metrics."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(plane.request_text("GET", "/metrics")):
        for sample in family.samples:
            if sample.name == "apiserver_request_total" and sample.labels.get("resource") == "pods":
                verb = sample.labels["verb"]
                totals[verb] = totals.get(verb, 0.0) + sample.value
    return totals


@pytest.mark.parametrize("values", [(), NAMESPACED], ids=["cluster", "namespaced"])
def test_lists_then_watches_the_pods_of_its_node(
    realkube: ControlPlane,
    realkube_namespace: str,
    helm: Helm,
    tmp_path: Path,
    values: tuple[str, ...],
) -> None:
    """The view holds exactly the pods whose spec.nodeName is its node, in every namespace
    under the ClusterRole and in the release namespace only under the namespaced Role; a
    pod added, re-annotated or deleted on the node reaches it through the watch; one LIST
    in all, no relist."""
    other = f"{realkube_namespace}-x"
    realkube.create_namespace(other)
    with open_scene(
        realkube, realkube_namespace, helm, tmp_path, components=("agent",), values=values
    ) as scene:
        node, elsewhere = "node-a-" + scene.release.name, "node-b-" + scene.release.name
        ns = scene.namespace
        scene.pod("w1", node, annotations={KEY: "300"})
        scene.pod("w2", node, namespace=other)
        scene.pod("w3", elsewhere)
        with _view(scene, node) as (view, own):
            agent_pod = {own}
            mine = {f"{ns}/w1"} | (set() if values else {f"{other}/w2"})
            _wait_names(view, mine | agent_pod)
            scene.pod("w4", node, annotations={KEY: "250"})
            _wait_names(view, mine | agent_pod | {f"{ns}/w4"})
            path = f"/api/v1/namespaces/{ns}/pods/w1"
            pod = realkube.request("GET", path)
            pod["metadata"]["annotations"][KEY] = "280"
            realkube.request("PUT", path, pod)
            wait_until(
                lambda: (
                    {p.ref.name: p.annotations.get(KEY) for p in view.snapshot().pods.values()}.get(
                        "w1"
                    )
                    == "280"
                ),
                what="the new annotation",
            )
            scene.delete_pod("w4")
            _wait_names(view, mine | agent_pod)
            stats = view.stats()
    realkube.delete_namespace(other)
    assert (stats.list_requests, stats.relists) == (1, 0)
    assert stats.watch_events >= 3


def test_steady_watching_makes_no_list(
    realkube: ControlPlane, realkube_namespace: str, helm: Helm, tmp_path: Path
) -> None:
    """Once synced, the view renews its watch each time the server ends it (every 2-3 s
    here) and every snapshot (each agent cycle takes one) is served from memory: across
    three renewals and many snapshots the API server counts no pod LIST at all (its own
    /metrics) and the view one in all."""
    with open_scene(realkube, realkube_namespace, helm, tmp_path, components=("agent",)) as scene:
        node = "node-" + scene.release.name
        scene.pod("w1", node, annotations={KEY: "300"})
        with _view(scene, node) as (view, _):
            wait_until(lambda: _synced(view), what="the first list")
            before, watches = _pod_lists(realkube), view.stats().watch_requests
            snapshots = 0

            def renewed() -> bool:
                nonlocal snapshots
                assert view.snapshot() is not None  # an agent cycle's read
                snapshots += 1
                return view.stats().watch_requests >= watches + 3

            wait_until(renewed, timeout=30, what="three watch renewals")
            after, stats = _pod_lists(realkube), view.stats()
    assert after.get("LIST", 0) == before.get("LIST", 0)
    assert after.get("WATCH", 0) >= before.get("WATCH", 0) + 3
    assert stats.list_requests == 1
    assert snapshots > 10


# --- an expired watch ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def compacting(
    realkube_binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """A control plane of this module's own whose pod watches go to etcd (no watch cache
    for pods, so a compaction expires them) and that never compacts unless told."""
    args = ["--watch-cache-sizes=pods#0", "--etcd-compaction-interval=0"]
    directory = tmp_path_factory.mktemp("compacting")
    with ControlPlane(directory, binaries=realkube_binaries, apiserver_args=args).start() as plane:
        yield plane


def _compact(plane: ControlPlane) -> int:
    """Compact etcd's history up to its current revision (etcd's v3 JSON gateway)."""
    assert plane.ports is not None
    etcd = f"http://127.0.0.1:{plane.ports.etcd_client}"

    def post(path: str, body: dict[str, object]) -> dict[str, object]:
        data = json.dumps(body).encode()
        request = urllib.request.Request(etcd + path, data, method="POST")  # noqa: S310
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback
            answer: dict[str, object] = json.loads(response.read())
        return answer

    key = base64.b64encode(b"/").decode()
    header = post("/v3/kv/range", {"key": key, "limit": 1})["header"]
    revision = int(header["revision"])  # type: ignore[index]
    post("/v3/kv/compaction", {"revision": revision, "physical": True})
    return revision


def test_a_watch_from_a_compacted_revision_is_gone_and_the_view_relists(
    compacting: ControlPlane, helm: Helm, tmp_path: Path
) -> None:
    """Other objects change while the node's pods do not, so the view's resourceVersion
    falls behind; etcd compacts past it: the view's next watch is answered 410 Gone by
    the real server, and the view lists again (one relist, two LISTs in all), is in sync
    at once, and sees a pod added after the compaction."""
    namespace = unique("compact").rstrip("-")
    compacting.create_namespace(namespace)
    with open_scene(compacting, namespace, helm, tmp_path, components=("agent",)) as scene:
        node = "node-" + scene.release.name
        scene.pod("w1", node)
        with _view(scene, node) as (view, _):
            wait_until(lambda: _synced(view), what="the first list")
            listed = view.snapshot().resource_version
            for i in range(5):
                compacting.request(
                    "POST",
                    f"/api/v1/namespaces/{namespace}/configmaps",
                    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"c{i}"}},
                )
            assert _compact(compacting) > int(listed)
            wait_until(lambda: view.stats().relists >= 1, timeout=30, what="a relist after 410")
            scene.pod("w2", node)
            wait_until(
                lambda: (
                    {"w1", "w2"}
                    <= {p.ref.name for p in (_synced(view) or PodSnapshot(pods={})).pods.values()}
                ),
                what="the pod added after the compaction",
            )
            stats = view.stats()
    compacting.delete_namespace(namespace)
    assert (stats.relists, stats.list_requests) == (1, 2)
