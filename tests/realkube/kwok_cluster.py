"""A real cluster's shape on loopback: KWOK nodes, the real controllers, one pod IP each.

The control plane runs kube-controller-manager (the DaemonSet and StatefulSet
controllers among all the others) and kube-scheduler beside the API server, and KWOK
keeps the fake GPU nodes Ready and the pods bound to them Running. Each node is made
with a ``spec.podCIDR`` of its own, a /24 inside 127.0.0.0/8 (127.64.0.0/24,
127.64.1.0/24, ... of 127.64.0.0/10: room for 16,384 nodes), so the pod KWOK runs there gets an IP
from it: the agent pod the chart's DaemonSet puts on node N has a loopback address no
other node's has, and a connection to it reaches whatever listens there (the
``capwatch pool`` serving every node). That is a real cluster's shape: the controller
discovers the agent pods from the API server and holds one connection per node.

Used by tests/realkube/test_kwok_cluster.py (200 nodes) and bench/scenarios/kwok.py (5,000).
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.realkube.access import ApiError
from tests.realkube.controlplane import ControlPlane
from tests.realkube.flags import KWOK_NODE_SELECTOR

GPU_LABEL = ("nvidia.com/gpu.present", "true")
POD_NETWORK = ipaddress.ip_network("127.64.0.0/10")
# The API server refuses loopback addresses in Endpoints and EndpointSlices, so with
# loopback pod IPs those controllers would retry every Service's endpoints for ever (at
# 5,000 nodes: 6,000 refusals and 86 MB of log in ten minutes). Nothing here reads them.
CONTROLLERS = (
    "*,-endpoints-controller,-endpointslice-controller,-endpointslice-mirroring-controller"
)


def pod_cidr(index: int) -> str:
    """Node ``index``'s podCIDR: the index-th /24 of 127.64.0.0/10."""
    if not 0 <= index < 2 ** (24 - POD_NETWORK.prefixlen):
        raise ValueError(f"no /24 left in {POD_NETWORK} for node {index}")
    return f"{ipaddress.ip_address(int(POD_NETWORK.network_address) + index * 256)}/24"


@contextmanager
def kwok_plane(directory: Path, binaries: dict[str, Path]) -> Iterator[ControlPlane]:
    """etcd, kube-apiserver, kube-controller-manager (no podCIDR allocation: the nodes
    bring their own), kube-scheduler and KWOK, stopped on the way out."""
    with ControlPlane(directory, binaries=binaries).start() as plane:
        plane.start_controller_manager(controllers=CONTROLLERS, cluster_cidr=None)
        plane.start_scheduler()
        plane.start_kwok()
        yield plane


@dataclass
class KwokNodes:
    """Fake GPU nodes on a :func:`kwok_plane`, and what runs on them."""

    plane: ControlPlane
    names: list[str]

    @classmethod
    def create(cls, plane: ControlPlane, prefix: str, count: int, *, workers: int = 8) -> KwokNodes:
        """``prefix0``... ``prefix{count-1}``: GPU-labelled, KWOK's, each its own podCIDR."""
        key, value = KWOK_NODE_SELECTOR.split("=")
        names = [f"{prefix}{i}" for i in range(count)]

        def make(index: int) -> None:
            body = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": names[index],
                    "annotations": {key: value},
                    "labels": {GPU_LABEL[0]: GPU_LABEL[1], "type": "kwok"},
                },
                "spec": {"podCIDR": pod_cidr(index), "podCIDRs": [pod_cidr(index)]},
            }
            plane.request("POST", "/api/v1/nodes", body)

        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(make, range(count)))
        return cls(plane=plane, names=names)

    def ready(self) -> int:
        """How many of the nodes KWOK has made Ready."""
        return sum(1 for node in self._nodes() if _condition(node, "Ready") == "True")

    def _nodes(self) -> list[dict[str, Any]]:
        wanted = set(self.names)
        # From the watch cache (resourceVersion=0): polling thousands of nodes must not
        # cost etcd a quorum read each time.
        path = "/api/v1/nodes?labelSelector=type%3Dkwok&resourceVersion=0"
        items = self.plane.request("GET", path)["items"]
        return [n for n in items if n["metadata"]["name"] in wanted]

    def wait_ready(self, *, timeout: float) -> None:
        _wait(lambda: self.ready() == len(self.names), timeout, f"{len(self.names)} nodes Ready")

    def running_pods(self, namespace: str, selector: str) -> dict[str, dict[str, Any]]:
        """The pods matching ``selector`` that are Running with an IP, by node."""
        path = f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}&resourceVersion=0"
        found = {}
        for pod in self.plane.request("GET", path)["items"]:
            status = pod.get("status", {})
            if status.get("phase") == "Running" and status.get("podIP"):
                found[pod["spec"].get("nodeName", "")] = pod
        return found

    def wait_pods(self, namespace: str, selector: str, *, timeout: float) -> dict[str, str]:
        """Every node's pod (of ``selector``) Running: node -> pod IP."""
        wanted = set(self.names)

        def all_running() -> bool:
            return wanted <= set(self.running_pods(namespace, selector))

        _wait(all_running, timeout, f"a Running pod of {selector} on each of {len(wanted)} nodes")
        pods = self.running_pods(namespace, selector)
        return {node: pods[node]["status"]["podIP"] for node in self.names}

    def delete(self) -> None:
        for name in self.names:
            try:
                self.plane.request("DELETE", f"/api/v1/nodes/{name}")
            except ApiError as err:
                if err.status != 404:
                    raise


def in_own_cidr(ips: dict[str, str], names: Sequence[str]) -> bool:
    """Whether each node's pod IP lies in that node's own podCIDR."""
    return all(
        ipaddress.ip_address(ips[name]) in ipaddress.ip_network(pod_cidr(index))
        for index, name in enumerate(names)
    )


def _condition(node: dict[str, Any], kind: str) -> str | None:
    for condition in node.get("status", {}).get("conditions") or []:
        if condition["type"] == kind:
            return str(condition["status"])
    return None


def _wait(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(2.0)
