"""Which agents to follow, and which nodes should have one.

- **Agent pods**, by list+watch (:mod:`capwatch.kube.informer`) of the chart's agent
  pods in the release namespace, keyed by ``spec.nodeName`` and dialled at
  ``podIP:<agent port>``. Pods, not EndpointSlices: an EndpointSlice lists only
  ready endpoints, and an unready agent is exactly the one whose node must be
  reported. A pod counts once it has an IP and is not terminating or finished;
  when a node briefly has two (an update replacing one), the newest is followed.
- **GPU nodes**, by list+watch of the nodes matching ``--gpu-node-selector``: a
  GPU node with no agent pod reads ``AgentMissing``. The same watch tells the
  writer what condition each Node carries now, so a new leader starts from the
  API's truth. Nodes are told only once the agent pods have been listed: before
  that a node's agent is not missing, just not known yet.
- **A static targets file** (``--targets``), for running outside a cluster and
  for benchmarks: one ``NODE ADDRESS`` pair per line, ``#`` starts a comment.
  It is read once, at start; a malformed file is a configuration error naming
  the line.

Stores are filled on the informers' threads; every change is handed to the
event loop (``call_soon_threadsafe``) and applied there to a :class:`DiscoverySink`.
Each object is cut down to the fields read here as it is decoded
(:func:`trimmed_node`, :func:`trimmed_pod`), so a list of thousands of Nodes
is never held whole between its pages and the loop.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from capwatch.controller.conditions import CONDITION_TYPE, NodeCondition
from capwatch.controller.objects import node_condition, resource_version
from capwatch.kit.addresses import host_port
from capwatch.kit.clock import Clock
from capwatch.kit.errors import ConfigError
from capwatch.kit.names import is_node_name
from capwatch.kube.informer import Informer, ListWatchRequests, WatchPolicy
from capwatch.kube.wire import as_mapping

log = logging.getLogger(__name__)


class DiscoverySink(Protocol):
    def target(self, node: str, address: str | None) -> None:
        """The agent of ``node`` is at ``address`` (None: it has none)."""

    def gpu_node(
        self,
        node: str,
        *,
        present: bool,
        condition: NodeCondition | None,
        version: int | None = None,
    ) -> None:
        """``node`` is (or stopped being) a GPU node; ``condition`` is what it carries at
        resourceVersion ``version`` (None: not comparable)."""


def parse_targets(path: Path) -> dict[str, str]:
    """``NODE ADDRESS`` per line, at least one; raises ConfigError naming the file and line."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("--targets", f"cannot read {path}: {exc}") from exc
    targets: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{number}"
        fields = line.split()
        if len(fields) != 2:
            raise ConfigError("--targets", f"{where}: expected 'NODE ADDRESS', got {line!r}")
        node, address = fields
        if not is_node_name(node):
            raise ConfigError("--targets", f"{where}: not a valid node name: {node!r}")
        if not _dialable(address):
            raise ConfigError(
                "--targets", f"{where}: expected host:port or unix:///path, got {address!r}"
            )
        if node in targets:
            raise ConfigError("--targets", f"{where}: node {node!r} is listed twice")
        targets[node] = address
    if not targets:
        # Read once, at start: a controller following nothing would do so for its whole
        # life without a word (or, with an API server, call every GPU node AgentMissing).
        raise ConfigError("--targets", f"{path} lists no agents (one 'NODE ADDRESS' per line)")
    return targets


def _dialable(address: str) -> bool:
    # A listener's forms (an empty host, port 0) name nothing to dial.
    if address.startswith("unix:///"):
        return address != "unix:///"
    split = host_port(address)
    return split is not None and bool(split[0]) and split[1] > 0


class StaticDiscovery:
    """The targets file's agents; no node watch (no ``AgentMissing`` without an API)."""

    def __init__(self, targets: Mapping[str, str]) -> None:
        self._targets = dict(targets)

    def start(self, sink: DiscoverySink) -> None:
        for node, address in sorted(self._targets.items()):
            sink.target(node, address)

    def sync_problem(self) -> str | None:
        return None

    def close(self) -> None:
        pass


@dataclass(frozen=True, kw_only=True)
class _AgentPod:
    node: str
    address: str
    created: str  # RFC 3339: newest wins on a node with two


def agent_pod(obj: Mapping[str, Any], *, port: int) -> tuple[str, _AgentPod | None]:
    """(uid, the pod as a target) from a pod's JSON; None when it is not dialable."""
    metadata = as_mapping(obj.get("metadata"))
    spec, status = as_mapping(obj.get("spec")), as_mapping(obj.get("status"))
    uid = str(metadata.get("uid") or "")
    node, ip = str(spec.get("nodeName") or ""), str(status.get("podIP") or "")
    finished = status.get("phase") in ("Succeeded", "Failed")
    if not node or not ip or finished or metadata.get("deletionTimestamp"):
        return uid, None
    try:
        host = f"[{ip}]" if ipaddress.ip_address(ip).version == 6 else ip
    except ValueError:
        log.warning("agent pod uid=%s has an unusable podIP %r", uid, ip)
        return uid, None
    return uid, _AgentPod(
        node=node, address=f"{host}:{port}", created=str(metadata.get("creationTimestamp") or "")
    )


class _LoopStore:
    """A Store whose changes are applied on the event loop, not the informer's thread."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_replace: Callable[[list[Mapping[str, Any]]], None],
        on_apply: Callable[[str, Mapping[str, Any]], None],
    ) -> None:
        self._loop = loop
        self._on_replace = on_replace
        self._on_apply = on_apply

    def replace(self, objects: list[Mapping[str, Any]]) -> None:
        self._loop.call_soon_threadsafe(self._on_replace, objects)

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        self._loop.call_soon_threadsafe(self._on_apply, kind, obj)


class KubernetesDiscovery:
    """Agent pods (or a static targets file) and GPU nodes, each by its own informer."""

    def __init__(
        self,
        *,
        pods: ListWatchRequests | None,
        nodes: ListWatchRequests,
        static_targets: Mapping[str, str] | None = None,
        agent_port: int,
        policy: WatchPolicy,
        clock: Clock,
    ) -> None:
        """``pods`` None: the agents are ``static_targets``, the nodes still watched."""
        if (pods is None) == (static_targets is None):
            raise ValueError("give the agent pods to watch or static targets, not both")
        self._pods_requests, self._nodes_requests = pods, nodes
        self._static = dict(static_targets or {})
        self._port = agent_port
        self._policy = policy
        self._clock = clock
        self._sink: DiscoverySink | None = None
        self._informers: list[Informer] = []
        self._pods: dict[str, _AgentPod] = {}  # by pod uid
        self._targets: dict[str, str] = {}  # node -> address, as last told to the sink
        self._gpu_nodes: set[str] = set()
        # Node changes that came before the first pod list, applied after it.
        self._pods_listed = pods is None
        self._held_nodes: list[Callable[[], None]] = []

    def start(self, sink: DiscoverySink) -> None:
        loop = asyncio.get_running_loop()
        self._sink = sink
        nodes = Informer(
            what="GPU nodes",
            requests=self._nodes_requests,
            store=_LoopStore(
                loop, self._after_pods(self._replace_nodes), self._after_pods(self._apply_node)
            ),
            clock=self._clock,
            policy=self._policy,
            trim=trimmed_node,
        )
        self._informers = [nodes]
        nodes.start("capwatch-discovery-nodes")
        if self._pods_requests is None:
            StaticDiscovery(self._static).start(sink)
            return
        pods = Informer(
            what="capwatch agent pods",
            requests=self._pods_requests,
            store=_LoopStore(loop, self._replace_pods, self._apply_pod),
            clock=self._clock,
            policy=self._policy,
            trim=trimmed_pod,
        )
        self._informers.append(pods)
        pods.start("capwatch-discovery-pods")

    def sync_problem(self) -> str | None:
        for informer in self._informers:
            problem = informer.sync_problem()
            if problem is not None:
                return problem
        return None if self._informers else "not started"

    def close(self) -> None:
        for informer in self._informers:
            informer.close()

    # --- agent pods (on the loop) --------------------------------------------------------

    def _replace_pods(self, objects: list[Mapping[str, Any]]) -> None:
        self._pods = {}
        for obj in objects:
            uid, pod = agent_pod(obj, port=self._port)
            if pod is not None:
                self._pods[uid] = pod
        self._publish_targets()
        if not self._pods_listed:
            self._pods_listed = True
            held, self._held_nodes = self._held_nodes, []
            for change in held:
                change()

    def _apply_pod(self, kind: str, obj: Mapping[str, Any]) -> None:
        uid, pod = agent_pod(obj, port=self._port)
        if kind == "DELETED" or pod is None:
            self._pods.pop(uid, None)
        else:
            self._pods[uid] = pod
        self._publish_targets()

    def _publish_targets(self) -> None:
        newest: dict[str, _AgentPod] = {}
        for pod in self._pods.values():
            if pod.node not in newest or pod.created > newest[pod.node].created:
                newest[pod.node] = pod
        targets = {node: pod.address for node, pod in newest.items()}
        assert self._sink is not None
        for node in self._targets.keys() - targets.keys():
            self._sink.target(node, None)
        for node, address in targets.items():
            if self._targets.get(node) != address:
                self._sink.target(node, address)
        self._targets = targets

    # --- GPU nodes (on the loop) ---------------------------------------------------------

    def _after_pods(self, apply: Callable[..., None]) -> Callable[..., None]:
        """``apply`` now if the agent pods have been listed, else once they have."""

        def call(*args: Any) -> None:
            if self._pods_listed:
                apply(*args)
            else:
                self._held_nodes.append(functools.partial(apply, *args))

        return call

    def _replace_nodes(self, objects: list[Mapping[str, Any]]) -> None:
        assert self._sink is not None
        seen: set[str] = set()
        for obj in objects:
            name = _name(obj)
            if name:
                seen.add(name)
                self._sink.gpu_node(
                    name,
                    present=True,
                    condition=node_condition(obj),
                    version=resource_version(obj),
                )
        for gone in self._gpu_nodes - seen:
            self._sink.gpu_node(gone, present=False, condition=None)
        self._gpu_nodes = seen

    def _apply_node(self, kind: str, obj: Mapping[str, Any]) -> None:
        assert self._sink is not None
        name = _name(obj)
        if not name:
            return
        present = kind != "DELETED"
        if present:
            self._gpu_nodes.add(name)
        else:
            self._gpu_nodes.discard(name)
        self._sink.gpu_node(
            name,
            present=present,
            condition=node_condition(obj) if present else None,
            version=resource_version(obj) if present else None,
        )


def trimmed_pod(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """What :func:`agent_pod` reads of an agent pod, and nothing else."""
    metadata = as_mapping(obj.get("metadata"))
    spec, status = as_mapping(obj.get("spec")), as_mapping(obj.get("status"))
    return {
        "metadata": _some(metadata, "name", "uid", "creationTimestamp", "deletionTimestamp"),
        "spec": _some(spec, "nodeName"),
        "status": _some(status, "podIP", "phase"),
    }


def trimmed_node(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """What discovery reads of a Node: its name, resourceVersion and capwatch's condition
    (a real Node carries its images, addresses, capacity and managedFields: kilobytes
    each, at thousands of nodes)."""
    metadata = as_mapping(obj.get("metadata"))
    conditions = as_mapping(obj.get("status")).get("conditions")
    ours = [c for c in conditions or [] if isinstance(c, dict) and c.get("type") == CONDITION_TYPE]
    return {"metadata": _some(metadata, "name", "resourceVersion"), "status": {"conditions": ours}}


def _some(obj: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {key: obj[key] for key in keys if key in obj}


def _name(obj: Mapping[str, Any]) -> str:
    return str(as_mapping(obj.get("metadata")).get("name") or "")
