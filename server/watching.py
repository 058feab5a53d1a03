"""capwatch.v1.NodeHealthService: ``Watch`` and ``GetSnapshot``.

A Watch stream reads the hub's ring buffer at its own pace: the loop never
waits for it. A subscriber that stops reading blocks only its own coroutine
(HTTP/2 flow control), holds at most the message in flight, and on its return
either catches up from the ring or, when its cycles have been overwritten,
receives a fresh snapshot marked ``resync``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import grpc

from agent.devices import DeviceState
from agent.reports import CycleReport
from server.encoding import EncodedCycle, encode_cycle, encode_readiness
from server.gen.capwatch.v1 import node_health_pb2 as pb
from server.limits import MAX_FILTER_UUIDS, MAX_HEARTBEAT_S, MAX_UUID_LENGTH, MIN_HEARTBEAT_S
from server.mapping import Include
from server.mapping import heartbeat as heartbeat_message
from server.publication import Publication, View

log = logging.getLogger(__name__)

# The default heartbeat comes 1.5 intervals after a stream's last message: a
# heartbeat timed at exactly one interval would fire, for every subscriber at
# once, just as the next cycle lands (the loop sleeps one interval between
# cycles). Cycles themselves show the agent alive; heartbeats fill the silence
# when a cycle hangs.
DEFAULT_HEARTBEAT_FACTOR = 1.5
ENCODED_CYCLES = 8  # cycles kept encoded for unfiltered streams (most read only the latest)
SERVICE = "capwatch.v1.NodeHealthService"


class NodeHealthServicer:
    """``Watch`` sends serialized bytes (see :mod:`server.encoding`), so the
    servicer is registered by :func:`add_to_server` with a pass-through
    serializer for it, not by the generated helper."""

    def __init__(self, publication: Publication) -> None:
        self._pub = publication
        # Key: the cycle and the readiness verdict; the value also keeps the
        # report and device table it was encoded from, compared by identity.
        self._encoded: dict[
            tuple[int, bool, str, str],
            tuple[CycleReport, Mapping[int, DeviceState], EncodedCycle],
        ] = {}

    async def GetSnapshot(
        self, request: pb.GetSnapshotRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.GetSnapshotResponse:
        await self._pub.check_node(request.node_name, context)
        include = await _filter(request.filter, context)
        return pb.GetSnapshotResponse(
            snapshot=self._pub.snapshot(self._pub.view(), include=include)
        )

    async def Watch(
        self, request: pb.WatchRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> AsyncIterator[bytes]:
        await self._pub.check_node(request.node_name, context)
        include = await _filter(request.filter, context)
        heartbeat_s = DEFAULT_HEARTBEAT_FACTOR * self._pub.interval_s
        requested = request.heartbeat_interval
        # Zero, sent or not, means the agent's default (the proto says so; a JSON
        # client sending "0s" sets the field).
        if requested.seconds or requested.nanos:
            # Not ToTimedelta(): the wire allows any int64 of seconds, more than
            # a timedelta holds (OverflowError).
            heartbeat_s = requested.seconds + requested.nanos / 1e9
            if not MIN_HEARTBEAT_S <= heartbeat_s <= MAX_HEARTBEAT_S:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"heartbeat_interval must be between {MIN_HEARTBEAT_S:g}s and "
                    f"{MAX_HEARTBEAT_S:g}s",
                )
        slot = await self._pub.admit(context)
        try:
            async for message in self._stream(request, include, heartbeat_s):
                self._pub.messages_sent += 1
                yield message
        finally:
            self._pub.unsubscribe(slot)

    async def _stream(
        self, request: pb.WatchRequest, include: Include | None, heartbeat_s: float
    ) -> AsyncIterator[bytes]:
        hub = self._pub.hub
        view = self._pub.view()
        cursor = view.state.sequence
        same_instance = request.agent_instance_id in ("", hub.instance_id)
        if request.since_sequence == 0:
            yield _serialized(snapshot=self._pub.snapshot(view, include=include))
        else:
            missed = hub.since(request.since_sequence) if same_instance else None
            if missed is None or request.since_sequence > view.state.sequence:
                yield _serialized(snapshot=self._pub.snapshot(view, resync=True, include=include))
            else:
                for report in missed:
                    yield self._cycle(report, view, include)
                cursor = missed[-1].sequence if missed else request.since_sequence
                if not missed:
                    yield _serialized(heartbeat=self._heartbeat(view))
        while not self._pub.stopping.is_set():
            if not await hub.wait(cursor, heartbeat_s):
                if self._pub.stopping.is_set():
                    return
                yield _serialized(heartbeat=self._heartbeat(self._pub.view()))
                continue
            view = self._pub.view()
            reports = hub.since(cursor)
            if reports is None:  # fell behind further than the ring holds
                log.info("watch subscriber fell behind; resyncing cursor=%d", cursor)
                yield _serialized(snapshot=self._pub.snapshot(view, resync=True, include=include))
                cursor = view.state.sequence
                continue
            for report in reports:
                yield self._cycle(report, view, include)
                cursor = report.sequence

    def _cycle(self, report: CycleReport, view: View, include: Include | None) -> bytes:
        # The table right after this cycle gives its transition times, even when
        # the cycle is sent late (a batch, a resume).
        devices = self._pub.hub.devices_at(report.sequence)
        if devices is None:
            devices = view.state.devices
        ready = view.readiness
        readiness = encode_readiness(
            ready, last_cycle_age_s=view.now_monotonic - report.finished_monotonic
        )
        if include is not None:
            return encode_cycle(
                report, devices=devices, namer=self._pub.namer, ready=ready, include=include
            ).watch_response(readiness)
        # Apart from the readiness, a cycle message is a function of the report,
        # the device table and the readiness verdict: encoded once for every
        # unfiltered stream.
        key = (report.sequence, ready.ready, ready.reason.value, ready.detail)
        hit = self._encoded.get(key)
        if hit is None or hit[0] is not report or hit[1] is not devices:
            encoded = encode_cycle(report, devices=devices, namer=self._pub.namer, ready=ready)
            self._encoded.pop(key, None)
            self._encoded[key] = hit = (report, devices, encoded)
            if len(self._encoded) > ENCODED_CYCLES:
                del self._encoded[next(iter(self._encoded))]
        return hit[2].watch_response(readiness)

    def _heartbeat(self, view: View) -> pb.Heartbeat:
        return heartbeat_message(
            wall=view.now_wall,
            sequence=view.state.sequence,
            instance_id=self._pub.hub.instance_id,
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
