"""Which node a request is about: the agent's own, or one of a pool's.

Every streaming service resolves the node first. A node agent serves one node:
a request naming another is refused (``FAILED_PRECONDITION``: a controller
that dialled a recycled pod IP must not be told another node's health). A
pool of simulated nodes (``capwatch pool``) serves many behind one server and
selects by the name: ``WatchRequest.node_name`` and
``GetSnapshotRequest.node_name`` for capwatch.v1, and the ``capwatch-node``
request metadata key for the DRA mirrors, whose request has no field for it.
In a pool a request must name a node (``INVALID_ARGUMENT`` otherwise); a name
the pool does not hold, or a node that has vanished, is ``NOT_FOUND``; a node
whose agent is silent (a fault the pool injects) is ``UNAVAILABLE``, and its
open streams are ended.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

import grpc

from capwatch.server.grpc.cycle_feed import CycleFeed
from capwatch.server.grpc.publication import Publication

NODE_METADATA_KEY = "capwatch-node"


@dataclass(frozen=True)
class Served:
    """One node as the services serve it: its publication and its cycles' broadcast."""

    publication: Publication
    feed: CycleFeed


class NodeDirectory(Protocol):
    async def resolve(self, node_name: str, context: grpc.aio.ServicerContext[Any, Any]) -> Served:
        """The node a request names, or the call ended with the status saying why."""

    def served(self) -> Iterable[Served]:
        """Every node (whatever its state), for the feeds and an ordered stop."""


def metadata_node(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    """The node a DRA request names in its metadata ("" when none)."""
    for key, value in context.invocation_metadata() or ():
        if key == NODE_METADATA_KEY:
            return value if isinstance(value, str) else value.decode(errors="replace")
    return ""


class OneNode:
    """The node agent's directory: its own node, and no other."""

    def __init__(self, publication: Publication) -> None:
        self.one = Served(publication, CycleFeed(publication))

    async def resolve(self, node_name: str, context: grpc.aio.ServicerContext[Any, Any]) -> Served:
        await self.one.publication.check_node(node_name, context)
        return self.one

    def served(self) -> Iterable[Served]:
        return (self.one,)


class NodeState(str, Enum):
    SERVING = "serving"
    SILENT = "silent"  # answers nothing: streams cut, requests UNAVAILABLE
    VANISHED = "vanished"  # not in the pool: NOT_FOUND


class ManyNodes:
    """A pool's directory: every node by name, each serving, silent or vanished."""

    def __init__(self, nodes: Mapping[str, Publication]) -> None:
        self._nodes = {name: Served(pub, CycleFeed(pub)) for name, pub in nodes.items()}
        self._states: dict[str, NodeState] = {}

    def __len__(self) -> int:
        return len(self._nodes)

    async def resolve(self, node_name: str, context: grpc.aio.ServicerContext[Any, Any]) -> Served:
        if not node_name:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"this is a pool of {len(self._nodes)} simulated nodes: name one "
                f"(node_name, or the {NODE_METADATA_KEY} metadata key)",
            )
        served = self._nodes.get(node_name)
        state = self._states.get(node_name, NodeState.SERVING)
        if served is None or state is NodeState.VANISHED:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no node {node_name!r} in this pool")
        if state is NodeState.SILENT:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"node {node_name!r} is silent")
        assert served is not None
        return served

    def served(self) -> Iterable[Served]:
        return self._nodes.values()

    def set_state(self, node_name: str, state: NodeState) -> None:
        """Make ``node_name`` serve, go silent or vanish (on the event loop)."""
        served = self._nodes[node_name]
        before = self._states.get(node_name, NodeState.SERVING)
        if state is before:
            return
        if state is NodeState.SERVING:
            self._states.pop(node_name, None)
            served.publication.stopping.clear()
            return
        self._states[node_name] = state
        # Its streams end at their next wake-up, which the nudge makes now.
        served.publication.stopping.set()
        served.feed.broadcast.nudge()
