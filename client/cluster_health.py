"""Subscribe to a capwatch controller's cluster stream, and stay subscribed.

:class:`ClusterHealthClient` turns ``capwatch.v1.ClusterHealthService/Watch``
into typed events, with the same reconnecting as
:class:`~capwatch.client.node_health.NodeHealthClient` (:mod:`capwatch.client.retrying`): on any
failure it yields :class:`Disconnected`, waits (0.2 s doubling to 10 s, full
jitter), reconnects and resumes after the last update it saw, so the consumer
gets exactly the updates it missed, or a snapshot marked ``resync`` when the
controller no longer buffers them or restarted. See docs/client.md.

Example::

    async with ClusterHealthClient(target="capwatch-controller:50052") as client:
        async with contextlib.aclosing(client.events()) as events:
            async for event in events:
                match event:
                    case ClusterSnapshot(snapshot=s):  # first, and after a resync
                        replace_all(s.nodes)
                    case NodeUpdate(update=u):  # one node changed (or left: u.removed)
                        apply(u.node, removed=u.removed)
                    case ClusterHeartbeat():  # the controller is alive, nothing new
                        pass
                    case Disconnected(error=e, retry_in=t):  # reconnecting after t s
                        mark_unknown(e)
"""

from __future__ import annotations

import random
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any

import grpc

from capwatch.api.gen.capwatch.v1 import cluster_health_pb2 as cpb
from capwatch.api.gen.capwatch.v1 import cluster_health_pb2_grpc as cpb_grpc
from capwatch.client.retrying import (
    DEFAULT_SNAPSHOT_TIMEOUT_S,
    ClientError,
    MonotonicClock,
    RetryingClient,
    checked_heartbeat,
    duration_seconds,
    silence_after,
)
from capwatch.client.stream_events import (
    ClusterEvent,
    ClusterHeartbeat,
    ClusterSnapshot,
    Disconnected,
    NodeUpdate,
    Position,
)
from capwatch.kit.backoff import Backoff
from capwatch.kit.errors import ConfigError

__all__ = [
    "ClientError",
    "ClusterEvent",
    "ClusterHealthClient",
    "ClusterHeartbeat",
    "ClusterSnapshot",
    "Disconnected",
    "NodeUpdate",
    "Position",
]

# The controller's heartbeat period when the request leaves it to the controller
# (controller/cluster/serving.py DEFAULT_HEARTBEAT_S; a test holds them equal).
CONTROLLER_HEARTBEAT_S = 10.0


class ClusterHealthClient(RetryingClient):
    """One controller replica's cluster stream (every replica of a shard serves it)."""

    peer = "controller"

    def __init__(
        self,
        *,
        target: str,
        root_certificates: bytes | None = None,
        private_key: bytes | None = None,
        certificate_chain: bytes | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        heartbeat_interval: float | None = None,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        clock: MonotonicClock | None = None,
        silence_timeout: float | None = None,
        snapshot_timeout: float = DEFAULT_SNAPSHOT_TIMEOUT_S,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        """``target``: the controller's ``host:port`` (its gRPC port, 50052). TLS and
        ``options`` as for :class:`~capwatch.client.node_health.NodeHealthClient`.
        ``heartbeat_interval``: None for the controller's (10 s). ``silence_timeout``:
        give up on a stream that sent nothing for this long (default: three
        heartbeat periods plus a second; ``math.inf`` relies on keepalive alone)."""
        super().__init__(
            target=target,
            root_certificates=root_certificates,
            private_key=private_key,
            certificate_chain=certificate_chain,
            credentials=credentials,
            backoff=backoff,
            rng=rng,
            clock=clock,
            silence_timeout=silence_timeout,
            snapshot_timeout=snapshot_timeout,
            options=options,
        )
        self._heartbeat_s = checked_heartbeat(heartbeat_interval)
        self._instance = ""
        self._sequence = 0
        self._pages: list[cpb.ClusterSnapshot] = []  # a paged snapshot's, until its last

    @property
    def position(self) -> Position:
        """The last update seen; pass it to :meth:`events` to resume in another client."""
        return Position(instance_id=self._instance, sequence=self._sequence)

    def events(
        self, *, since: int = 0, instance_id: str = ""
    ) -> AsyncGenerator[ClusterEvent, None]:
        """Typed events, reconnecting for ever; resume after update ``since`` of
        controller instance ``instance_id``.

        ``since=0`` starts with a snapshot. A ``since`` with ``instance_id`` ""
        means the controller's current instance. One iteration at a time per client.
        """
        if since < 0:
            raise ConfigError("since", "must not be negative")
        self._check_idle()
        self._sequence, self._instance = since, instance_id
        return self._retrying(self._watch, self._on_message, self._silence)

    async def snapshot(
        self, *, deadline_s: float | None = None, page_size: int = 0
    ) -> cpb.ClusterSnapshot:
        """Every node of the shard now: unary ``GetClusterSnapshot``, page after page
        (``page_size`` nodes each; 0: the controller's 1,000), joined. Each page has
        ``deadline_s`` (default ``snapshot_timeout``). Raises ClientError (the
        controller restarting between two pages: INVALID_ARGUMENT)."""
        pages: list[cpb.ClusterSnapshot] = []
        token = ""
        while True:
            request = cpb.GetClusterSnapshotRequest(page_size=page_size, page_token=token)
            response = await self._unary("GetClusterSnapshot", _page(request), deadline_s)
            pages.append(response.snapshot)
            token = response.next_page_token
            if not token:
                return joined(pages)

    def _watch(self, channel: grpc.aio.Channel) -> Any:
        self._pages = []  # a snapshot cut short by a lost stream is never applied
        return cpb_grpc.ClusterHealthServiceStub(channel).Watch(self._request())

    def _request(self) -> cpb.ClusterHealthServiceWatchRequest:
        request = cpb.ClusterHealthServiceWatchRequest(
            since_sequence=self._sequence, controller_instance_id=self._instance
        )
        if self._heartbeat_s is not None:
            request.heartbeat_interval.FromTimedelta(timedelta(seconds=self._heartbeat_s))
        return request

    def _silence(self) -> float | None:
        if self._silence_s is not None:
            return self._silence_s
        return silence_after(self._heartbeat_s or CONTROLLER_HEARTBEAT_S)

    def _on_message(self, message: Any, now: float) -> ClusterEvent | None:
        kind = message.WhichOneof("event")
        if kind == "snapshot":
            page: cpb.ClusterSnapshot = message.snapshot
            for node in page.nodes:
                _check_node(node, "snapshot.nodes")
            self._pages.append(page)
            if page.more:
                return None  # applied whole, at its last page
            pages, self._pages = tuple(self._pages), []
            snapshot = joined(pages)
            restarted = self._instance not in ("", snapshot.controller_instance_id)
            self._instance, self._sequence = snapshot.controller_instance_id, snapshot.sequence
            return ClusterSnapshot(
                snapshot=snapshot,
                resync=snapshot.resync,
                restarted=restarted,
                received_at=now,
                pages=pages if len(pages) > 1 else (),
            )
        if kind == "update":
            update: cpb.NodeUpdate = message.update
            _check_node(update.node, "update.node")
            self._sequence = update.sequence
            return NodeUpdate(update=update, received_at=now)
        if kind == "heartbeat":
            heartbeat: cpb.ClusterHeartbeat = message.heartbeat
            # Not its last_sequence: an update sent just after it may not have
            # arrived, and resuming past it would lose that update.
            self._instance = self._instance or heartbeat.controller_instance_id
            return ClusterHeartbeat(heartbeat=heartbeat, received_at=now)
        return None  # an event kind from a newer controller: skip it


def _check_node(node: cpb.NodeHealth, where: str) -> None:
    """Raise MalformedMessage when the node's cycle age is no Duration (so that no
    consumer's ``ToTimedelta()`` can raise)."""
    if node.HasField("last_cycle_age"):
        duration_seconds(node.last_cycle_age, f"{where}.last_cycle_age")


def _page(
    request: cpb.GetClusterSnapshotRequest,
) -> Callable[[grpc.aio.Channel, float], Awaitable[cpb.GetClusterSnapshotResponse]]:
    def call(channel: grpc.aio.Channel, timeout: float) -> Any:
        return cpb_grpc.ClusterHealthServiceStub(channel).GetClusterSnapshot(
            request, timeout=timeout
        )

    return call


def joined(pages: Sequence[cpb.ClusterSnapshot]) -> cpb.ClusterSnapshot:
    """One snapshot of every page's nodes, with the last page's header (``more`` false)."""
    if len(pages) == 1:
        return pages[0]
    whole = cpb.ClusterSnapshot()
    whole.CopyFrom(pages[-1])
    del whole.nodes[:]
    for page in pages:
        whole.nodes.extend(page.nodes)
    return whole
