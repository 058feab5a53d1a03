"""The controller's gRPC server: ``capwatch.v1.ClusterHealthService``, health, reflection.

``Watch`` sends a snapshot of every node of the shard (in pages of 1,000
nodes, ``more`` set on all but the last), then each published
update (pre-encoded bytes, the same for every stream) as its subscriber reads
them, and heartbeats when nothing changed for the heartbeat period. A stream
that resumes (``since_sequence`` of this controller instance) gets the
updates it missed while the ring still holds them, else a snapshot marked
``resync``; a stream that falls behind the ring is resynced the same way. A
stuck subscriber blocks only its own stream.

gRPC health reports SERVING for ``""`` and the service while the controller
is ready (its discovery in sync), so a native gRPC probe can stand in for the
HTTP one.

What a client may ask is bounded as on the agent's server, by the same code:
every method is behind the interceptor that answers a request whose bytes do
not parse with INVALID_ARGUMENT and one throttled log line
(:mod:`capwatch.server.malformed`); a requested heartbeat is read as range-checked
seconds, never through ``ToTimedelta()`` (:func:`capwatch.api.limits.requested_heartbeat`);
and stream slots are claimed by the agent's rules (:mod:`capwatch.server.admission`):
:data:`MAX_SUBSCRIBERS` Watch streams in all, at most
:data:`MAX_STREAMS_PER_PEER` of them from one client address, so no single
client can take every slot and lock the dashboards out. A refusal is
RESOURCE_EXHAUSTED naming the limit, and a throttled line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from capwatch.api.durations import DurationError
from capwatch.api.gen.capwatch.v1 import cluster_health_pb2 as cpb
from capwatch.api.limits import requested_heartbeat
from capwatch.controller.cluster.state import PAGE_SIZE, ClusterView
from capwatch.kit.broadcast import Signal
from capwatch.kit.throttling import ThrottledLog
from capwatch.server.admission import Admission, Refusal, StreamLimits, peer_address
from capwatch.server.listeners import OPTIONS, ServeError, address_in_use
from capwatch.server.malformed import MalformedRequests

log = logging.getLogger(__name__)

SERVICE = cpb.DESCRIPTOR.services_by_name["ClusterHealthService"].full_name
DEFAULT_HEARTBEAT_S = 10.0
MAX_SUBSCRIBERS = 1000
MAX_STREAMS_PER_PEER = 100  # a tenth: locking everyone out takes ten client addresses
MAX_PAGE_SIZE = 5000
HEALTH_POLL_S = 1.0


class ClusterHealthServicer:
    def __init__(
        self,
        view: ClusterView,
        *,
        max_subscribers: int = MAX_SUBSCRIBERS,
        max_per_peer: int | None = MAX_STREAMS_PER_PEER,
    ) -> None:
        self._view = view
        self.admission = Admission(
            StreamLimits(max_subscribers=max_subscribers, max_per_peer=max_per_peer)
        )
        self.stopping = asyncio.Event()
        self._refusal_log = ThrottledLog(log)

    @property
    def subscribers(self) -> int:
        return self.admission.subscribers

    async def GetClusterSnapshot(
        self, request: cpb.GetClusterSnapshotRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> cpb.GetClusterSnapshotResponse:
        size = request.page_size or PAGE_SIZE
        if size > MAX_PAGE_SIZE:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"page_size must be at most {MAX_PAGE_SIZE}"
            )
        after = ""
        if request.page_token:
            instance, _, after = request.page_token.partition("/")
            if instance != self._view.instance_id or not after:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "page_token is not from this controller instance (it restarted): start again",
                )
        page, last = self._view.page(after=after, page_size=size)
        token = f"{self._view.instance_id}/{last}" if last else ""
        return cpb.GetClusterSnapshotResponse(snapshot=page, next_page_token=token)

    async def Watch(
        self,
        request: cpb.ClusterHealthServiceWatchRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[bytes]:
        try:
            requested = requested_heartbeat(request.heartbeat_interval)
        except DurationError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        heartbeat_s = DEFAULT_HEARTBEAT_S if requested is None else requested
        if self.stopping.is_set():
            await context.abort(grpc.StatusCode.UNAVAILABLE, "controller is shutting down")
        peer = context.peer()
        slot = self.admission.claim(peer_address(peer))
        if isinstance(slot, Refusal):
            self._refusal_log.warning(
                "cluster stream refused peer=%s reason=%s: %s",
                peer,
                slot.reason.value,
                slot.message,
            )
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, slot.message)
        try:
            async for message in self._stream(request, heartbeat_s):
                yield message
        finally:
            self.admission.release(slot)

    async def _stream(
        self, request: cpb.ClusterHealthServiceWatchRequest, heartbeat_s: float
    ) -> AsyncIterator[bytes]:
        view, broadcast = self._view, self._view.broadcast
        since = request.since_sequence
        same = request.controller_instance_id in ("", view.instance_id)
        resume = since > 0 and same and since <= view.sequence and broadcast.holds_after(since)
        if resume:
            after = since
        else:
            after = view.sequence
            for page in view.snapshot(resync=since > 0):
                yield _encoded(snapshot=page)
        with broadcast.subscribe(after=after, quiet_s=heartbeat_s) as subscription:
            while True:
                message = await subscription.next()
                if message is Signal.CLOSED:
                    return
                if message is Signal.QUIET:
                    yield _encoded(heartbeat=view.heartbeat())
                elif message is Signal.BEHIND:
                    log.info("cluster stream subscriber fell behind; resyncing")
                    subscription.position = view.sequence
                    for page in view.snapshot(resync=True):
                        yield _encoded(snapshot=page)
                else:
                    assert isinstance(message, bytes)
                    yield message


def _encoded(
    *, snapshot: cpb.ClusterSnapshot | None = None, heartbeat: cpb.ClusterHeartbeat | None = None
) -> bytes:
    return cpb.ClusterHealthServiceWatchResponse(
        snapshot=snapshot, heartbeat=heartbeat
    ).SerializeToString()


def add_to_server(servicer: ClusterHealthServicer, server: grpc.aio.Server) -> None:
    """Register the service with Watch's messages passed through as bytes."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        "Watch": grpc.unary_stream_rpc_method_handler(
            servicer.Watch,
            request_deserializer=cpb.ClusterHealthServiceWatchRequest.FromString,
            response_serializer=None,
        ),
        "GetClusterSnapshot": grpc.unary_unary_rpc_method_handler(
            servicer.GetClusterSnapshot,
            request_deserializer=cpb.GetClusterSnapshotRequest.FromString,
            response_serializer=cpb.GetClusterSnapshotResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)


class ClusterServer:
    """The cluster stream's gRPC server; ``ready`` decides what gRPC health says."""

    def __init__(
        self,
        *,
        view: ClusterView,
        listen: str,
        ready: Callable[[], bool],
        max_subscribers: int = MAX_SUBSCRIBERS,
        max_per_peer: int | None = MAX_STREAMS_PER_PEER,
    ) -> None:
        self._view = view
        self._listen = listen
        self._ready = ready
        self._malformed = MalformedRequests()
        self._server = grpc.aio.server(interceptors=(self._malformed,), options=OPTIONS)
        self.servicer = ClusterHealthServicer(
            view, max_subscribers=max_subscribers, max_per_peer=max_per_peer
        )
        self._health = HealthServicer()
        self._health_task: asyncio.Task[None] | None = None
        self.address = ""
        add_to_server(self.servicer, self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        reflection.enable_server_reflection(
            (
                SERVICE,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            self._server,
        )

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        return [] if self._health_task is None else [self._health_task]

    def malformed_requests(self) -> int:
        """Requests refused because their bytes did not parse."""
        return self._malformed.count

    async def start(self) -> None:
        """Bind and serve. Raises ServeError when the address cannot be bound."""
        busy = address_in_use(self._listen)  # before grpc, which logs its own raw line
        if busy:
            raise ServeError(f"--grpc-listen: cannot listen on {self._listen}: {busy}")
        try:
            port = self._server.add_insecure_port(self._listen)
        except RuntimeError as exc:
            raise ServeError(f"--grpc-listen: cannot listen on {self._listen}: {exc}") from exc
        if port == 0:
            raise ServeError(f"--grpc-listen: cannot listen on {self._listen} (address in use?)")
        await self._server.start()
        self.address = f"{self._listen.rsplit(':', 1)[0]}:{port}"
        self._health_task = asyncio.create_task(self._track_health(), name="capwatch-grpc-health")
        log.info("cluster stream serving address=%s", self.address)

    async def _track_health(self) -> None:
        serving = None
        while True:
            now = self._ready()
            if now != serving:
                status = (
                    health_pb2.HealthCheckResponse.SERVING
                    if now
                    else health_pb2.HealthCheckResponse.NOT_SERVING
                )
                for name in ("", SERVICE):
                    await self._health.set(name, status)
                serving = now
            await asyncio.sleep(HEALTH_POLL_S)

    async def stop(self, grace_s: float = 2.0) -> None:
        """Health NOT_SERVING, streams ended with OK, then the server stopped. Idempotent."""
        if self.servicer.stopping.is_set():
            return
        await self._health.enter_graceful_shutdown()
        self.servicer.stopping.set()
        self._view.close()
        await self._server.stop(grace_s)
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
