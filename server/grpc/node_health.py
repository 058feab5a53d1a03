"""capwatch.v1.NodeHealthService: ``Watch`` and ``GetSnapshot``.

A Watch stream follows the node's cycles on a shared broadcast
(:mod:`capwatch.server.grpc.cycle_feed`, :mod:`capwatch.kit.broadcast`) at its own pace: the loop
never waits for it, and every stream without a device filter sends a cycle's
one encoded message. A subscriber that stops reading blocks only its own
coroutine (HTTP/2 flow control), holds at most the message in flight, and on
its return either catches up from the ring or, when its cycles have been
overwritten, receives a fresh snapshot marked ``resync``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from capwatch.api.durations import DurationError
from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.api.limits import MAX_FILTER_UUIDS, MAX_UUID_LENGTH, requested_heartbeat
from capwatch.kit.broadcast import Signal
from capwatch.server.grpc.cycle_feed import SharedCycle
from capwatch.server.grpc.mapping import Include
from capwatch.server.grpc.mapping import heartbeat as heartbeat_message
from capwatch.server.grpc.nodes import NodeDirectory, Served
from capwatch.server.grpc.publication import Publication, View

log = logging.getLogger(__name__)

# The default heartbeat comes 1.5 intervals after a stream's last message: a
# heartbeat timed at exactly one interval would fire, for every subscriber at
# once, just as the next cycle lands (the loop sleeps one interval between
# cycles). Cycles themselves show the agent alive; heartbeats fill the silence
# when a cycle hangs.
DEFAULT_HEARTBEAT_FACTOR = 1.5
SERVICE = "capwatch.v1.NodeHealthService"


class NodeHealthServicer:
    """``Watch`` sends serialized bytes (see :mod:`capwatch.server.grpc.encoding`), so the
    servicer is registered by :func:`add_to_server` with a pass-through
    serializer for it, not by the generated helper."""

    def __init__(self, nodes: NodeDirectory) -> None:
        self._nodes = nodes

    async def feed(self) -> None:
        """Publish every node's cycles to its streams until its hub releases its readers.

        The server runs it as a task of its own from start to stop; the
        streams end when it does."""
        await asyncio.gather(*(served.feed.run() for served in self._nodes.served()))

    async def GetSnapshot(
        self, request: pb.GetSnapshotRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.GetSnapshotResponse:
        pub = (await self._nodes.resolve(request.node_name, context)).publication
        include = await _filter(request.filter, context)
        return pb.GetSnapshotResponse(snapshot=pub.snapshot(pub.view(), include=include))

    async def Watch(
        self, request: pb.WatchRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> AsyncIterator[bytes]:
        served = await self._nodes.resolve(request.node_name, context)
        pub, feed = served.publication, served.feed
        include = await _filter(request.filter, context)
        heartbeat_s = await _heartbeat_period(request, pub, context)
        slot = await pub.admit(context)
        # One generator, not a second one wrapped in it: a message costs a frame less.
        try:
            opening, cursor = _opening(served, request, include)
            for message in opening:
                pub.messages_sent += 1
                yield message
            clock = pub.clock
            with feed.broadcast.subscribe(after=cursor, quiet_s=heartbeat_s) as cycles:
                while True:
                    # Stopped (a pool's node gone silent) while this stream was sending
                    # rather than waiting, so the nudge missed it: end once it has sent
                    # every cycle recorded.
                    if pub.stopping.is_set() and cycles.position >= pub.hub.state().sequence:
                        return
                    cycle = await cycles.next()
                    if isinstance(cycle, SharedCycle):
                        pub.messages_sent += 1
                        if include is None:  # the same bytes for every stream in the window
                            yield cycle.wire(clock.monotonic())
                        else:
                            yield feed.filtered(cycle, include)
                    elif cycle is Signal.CLOSED or pub.stopping.is_set():
                        return
                    elif cycle is Signal.QUIET:
                        pub.messages_sent += 1
                        yield _serialized(heartbeat=_heartbeat(pub, pub.view()))
                    else:  # fell behind further than the ring holds
                        log.info(
                            "watch subscriber fell behind; resyncing cursor=%d", cycles.position
                        )
                        feed.catch_up()
                        view = pub.view()
                        pub.messages_sent += 1
                        yield _serialized(snapshot=pub.snapshot(view, resync=True, include=include))
                        cycles.position = view.state.sequence
        finally:
            pub.unsubscribe(slot)


async def _heartbeat_period(
    request: pb.WatchRequest, pub: Publication, context: grpc.aio.ServicerContext[object, object]
) -> float:
    try:
        heartbeat_s = requested_heartbeat(request.heartbeat_interval)
    except DurationError as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    return DEFAULT_HEARTBEAT_FACTOR * pub.interval_s if heartbeat_s is None else heartbeat_s


def _opening(
    served: Served, request: pb.WatchRequest, include: Include | None
) -> tuple[list[bytes], int]:
    """What a stream sends before following the broadcast, and the cycle it follows after:
    a snapshot; the missed cycles (from the ring); or a snapshot marked resync."""
    pub, feed = served.publication, served.feed
    feed.catch_up()  # the broadcast holds every cycle the view below may know
    view = pub.view()
    cursor = view.state.sequence
    since = request.since_sequence
    if since == 0:
        return [_serialized(snapshot=pub.snapshot(view, include=include))], cursor
    if (
        request.agent_instance_id not in ("", pub.hub.instance_id)
        or since > cursor
        or not feed.broadcast.holds_after(since)
    ):
        return [_serialized(snapshot=pub.snapshot(view, resync=True, include=include))], cursor
    # Nothing missed: say so; else the missed cycles come from the broadcast's ring.
    return ([_serialized(heartbeat=_heartbeat(pub, view))] if since == cursor else []), since


def _heartbeat(pub: Publication, view: View) -> pb.Heartbeat:
    return heartbeat_message(
        wall=view.now_wall,
        sequence=view.state.sequence,
        instance_id=pub.hub.instance_id,
        ready=view.readiness,
        last_cycle_age_s=view.last_cycle_age_s,
    )


def add_to_server(servicer: NodeHealthServicer, server: grpc.aio.Server) -> None:
    """Register the service as the generated helper would, but with Watch's
    messages passed through as the bytes the servicer serialized."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        "Watch": grpc.unary_stream_rpc_method_handler(
            servicer.Watch,
            request_deserializer=pb.WatchRequest.FromString,
            response_serializer=None,
        ),
        "GetSnapshot": grpc.unary_unary_rpc_method_handler(
            servicer.GetSnapshot,
            request_deserializer=pb.GetSnapshotRequest.FromString,
            response_serializer=pb.GetSnapshotResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)


def _serialized(
    *, snapshot: pb.NodeSnapshot | None = None, heartbeat: pb.Heartbeat | None = None
) -> bytes:
    return pb.WatchResponse(snapshot=snapshot, heartbeat=heartbeat).SerializeToString()


async def _filter(
    request: pb.DeviceFilter, context: grpc.aio.ServicerContext[object, object]
) -> Include | None:
    indexes = frozenset(request.indexes)
    uuids = frozenset(u.lower() for u in request.uuids)
    if len(request.uuids) > MAX_FILTER_UUIDS or any(len(u) > MAX_UUID_LENGTH for u in uuids):
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"filter.uuids: at most {MAX_FILTER_UUIDS} UUIDs of at most {MAX_UUID_LENGTH} chars",
        )
    if not indexes and not uuids:
        return None

    def include(index: int, uuid: str | None) -> bool:
        return index in indexes or (uuid is not None and uuid.lower() in uuids)

    return include
