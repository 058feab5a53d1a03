"""Subscribe to a node agent's health stream, and stay subscribed.

:class:`NodeHealthClient` turns ``capwatch.v1.NodeHealthService/Watch`` into a
stream of typed events that survives agent restarts and network cuts: on any
failure it yields :class:`Disconnected`, waits (exponential backoff, full
jitter), reconnects and resumes from the last cycle it saw, so the consumer
gets exactly the cycles it missed, or a snapshot marked ``resync`` when the
agent no longer buffers them or restarted. It never gives up on its own: stop
iterating (or call :meth:`NodeHealthClient.close`) to stop. See docs/client.md.

The wait between attempts is :mod:`server.backoff`'s: 0.2 s doubling to 10 s
for a network target, at most one agent interval (and 1 s) on a unix socket.

Example::

    async with NodeHealthClient(target="unix:///run/capwatch/agent.sock") as client:
        async with contextlib.aclosing(client.events()) as events:
            async for event in events:
                match event:
                    case Snapshot(snapshot=s):  # first, and after a resync
                        replace_state(s.devices)
                    case Cycle(cycle=c):  # one per completed reconcile cycle
                        apply(c.devices)
                    case Heartbeat():  # the agent is alive, no new cycle
                        pass
                    case Disconnected(error=e, retry_in=t):  # reconnecting after t s
                        mark_unknown(e)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
from collections.abc import AsyncGenerator, Callable, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any, Protocol, TypeVar

import grpc

from agent.clock import SystemClock
from agent.errors import CapwatchError, ConfigError
from server.backoff import LOCAL_CHANNEL_OPTIONS, Backoff, is_local, local_backoff
from server.events import (
    Cycle,
    DeviceList,
    Disconnected,
    DraEvent,
    DraVersion,
    Event,
    Heartbeat,
    ObservedReadiness,
    Position,
    Snapshot,
)
from server.gen.capwatch.v1 import node_health_pb2 as pb
from server.gen.capwatch.v1 import node_health_pb2_grpc as pb_grpc
from server.gen.v1 import dra_health_pb2 as v1_pb
from server.gen.v1 import dra_health_pb2_grpc as v1_grpc
from server.gen.v1alpha1 import dra_health_pb2 as v1alpha1_pb
from server.gen.v1alpha1 import dra_health_pb2_grpc as v1alpha1_grpc
from server.limits import MAX_HEARTBEAT_S, MIN_HEARTBEAT_S

__all__ = [
    "Backoff",
    "ClientError",
    "Cycle",
    "DeviceList",
    "Disconnected",
    "DraEvent",
    "DraVersion",
    "Event",
    "Heartbeat",
    "NodeHealthClient",
    "ObservedReadiness",
    "Position",
    "Snapshot",
]

log = logging.getLogger(__name__)

DEFAULT_SNAPSHOT_TIMEOUT_S = 5.0
# A stream is presumed dead after this many heartbeat periods without a message.
SILENT_PERIODS = 3
SILENT_MARGIN_S = 1.0

CHANNEL_OPTIONS: Sequence[tuple[str, Any]] = (
    # Notice a dead agent or a cut link on a quiet connection; the agent
    # accepts a ping every 10 s at most.
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    # As much as the agent may send (a snapshot of a big node).
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
    # Each reconnect opens a new channel, so this client's backoff is the only
    # one in play; channels must not share (grpc's default) a subchannel still
    # sitting out grpc's own reconnect backoff (1 s and up) after a failure.
    ("grpc.use_local_subchannel_pool", 1),
)


class ClientError(CapwatchError):
    """A call to the agent failed (``code`` is its gRPC status, None when it never ran)."""

    def __init__(self, message: str, *, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class MonotonicClock(Protocol):
    def monotonic(self) -> float: ...


_E = TypeVar("_E")
_Call = grpc.aio.UnaryStreamCall[Any, Any]
_CLOSED = object()


class _Silent(Exception):
    pass


class NodeHealthClient:
    """One agent's stream; one client per node for a controller watching a cluster."""

    def __init__(
        self,
        *,
        target: str,
        node_name: str = "",
        root_certificates: bytes | None = None,
        private_key: bytes | None = None,
        certificate_chain: bytes | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        heartbeat_interval: float | None = None,
        indexes: Sequence[int] = (),
        uuids: Sequence[str] = (),
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        clock: MonotonicClock | None = None,
        silence_timeout: float | None = None,
        snapshot_timeout: float = DEFAULT_SNAPSHOT_TIMEOUT_S,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        """``target``: ``host:port`` or ``unix:///path``. ``node_name``: the node the
        agent there must be serving (it refuses a stream for another with
        FAILED_PRECONDITION; "" accepts any). TLS when any certificate
        bytes or ``credentials`` are given. ``heartbeat_interval``: None for the
        agent's cycle interval. ``indexes``/``uuids``: report only these GPUs.
        ``silence_timeout``: give up on a stream that sent nothing for this long
        (default: three heartbeat periods plus a second, once the period is
        known; ``math.inf`` relies on keepalive alone). ``options`` are extra
        channel arguments, overriding :data:`CHANNEL_OPTIONS`."""
        if not target:
            raise ConfigError("target", "must not be empty")
        if (private_key is None) != (certificate_chain is None):
            raise ConfigError("private_key", "private_key and certificate_chain go together")
        tls_bytes = root_certificates is not None or certificate_chain is not None
        if credentials is not None and tls_bytes:
            raise ConfigError("credentials", "give credentials or certificate bytes, not both")
        if heartbeat_interval is not None and not (
            MIN_HEARTBEAT_S <= heartbeat_interval <= MAX_HEARTBEAT_S
        ):
            raise ConfigError(
                "heartbeat_interval",
                f"must be between {MIN_HEARTBEAT_S}s and {MAX_HEARTBEAT_S:g}s",
            )
        if silence_timeout is not None and not silence_timeout > 0:
            raise ConfigError("silence_timeout", "must be positive")
        if not snapshot_timeout > 0:
            raise ConfigError("snapshot_timeout", "must be positive")
        if tls_bytes:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=root_certificates,
                private_key=private_key,
                certificate_chain=certificate_chain,
            )
        self.target = target
        self.node_name = node_name
        self._local = is_local(target)
        self._credentials = credentials
        local_options = dict(LOCAL_CHANNEL_OPTIONS) if self._local else {}
        self._options = tuple({**dict(CHANNEL_OPTIONS), **local_options, **dict(options)}.items())
        self._heartbeat_s = heartbeat_interval
        self._filter = pb.DeviceFilter(indexes=list(indexes), uuids=list(uuids))
        self.backoff = backoff or Backoff()
        self._rng = rng or random.Random()
        self._clock: MonotonicClock = clock or SystemClock()
        self._silence_s = silence_timeout
        self._snapshot_timeout_s = snapshot_timeout
        self._closed = asyncio.Event()
        self._busy = False
        self._call: _Call | None = None
        self._stream_channel: grpc.aio.Channel | None = None
        self._unary_channel: grpc.aio.Channel | None = None
        self._instance = ""
        self._sequence = 0
        self._interval_s: float | None = None
        self._readiness: ObservedReadiness | None = None

    async def __aenter__(self) -> NodeHealthClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def position(self) -> Position:
        """The last cycle seen; pass it to :meth:`events` to resume in another client."""
        return Position(instance_id=self._instance, sequence=self._sequence)

    @property
    def last_readiness(self) -> ObservedReadiness | None:
        """The newest readiness any message carried, kept across disconnects."""
        return self._readiness

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    @property
    def reconnect_backoff(self) -> Backoff:
        """The backoff in effect now: ``backoff``, capped on a unix socket at the
        agent's interval (once a snapshot has told it) and at 1 s."""
        if not self._local:
            return self.backoff
        return local_backoff(self.backoff, interval_s=self._interval_s)

    def events(self, *, since: int = 0, instance_id: str = "") -> AsyncGenerator[Event, None]:
        """Typed events, reconnecting for ever; resume after ``since`` of ``instance_id``.

        ``since=0`` starts with a snapshot. A ``since`` with ``instance_id`` ""
        means the agent's current instance. One iteration at a time per client.
        """
        if since < 0:
            raise ConfigError("since", "must not be negative")
        if self._busy:
            raise ClientError("this client is already streaming; use one iteration at a time")
        self._sequence, self._instance = since, instance_id
        return self._retrying(
            lambda channel: pb_grpc.NodeHealthServiceStub(channel).Watch(self._request()),
            self._on_watch,
            self._watch_silence,
        )

    def dra_devices(self, version: DraVersion) -> AsyncGenerator[DraEvent, None]:
        """The kubelet's view (``NodeWatchResources``): every full device list sent."""
        stub: Any = (
            v1_grpc.DRAResourceHealthStub
            if version is DraVersion.V1
            else v1alpha1_grpc.DRAResourceHealthStub
        )
        request: Any = (
            v1_pb.NodeWatchResourcesRequest()
            if version is DraVersion.V1
            else v1alpha1_pb.NodeWatchResourcesRequest()
        )
        # The agent re-sends the list well within the timeout it states there.
        stated_timeout_s: dict[str, float] = {}

        def on_message(message: Any, now: float) -> DeviceList:
            if message.devices:
                stated_timeout_s["last"] = message.devices[0].health_check_timeout_seconds
            return DeviceList(response=message, version=version, received_at=now)

        def silence() -> float | None:
            if self._silence_s is not None:
                return self._silence_s
            stated = stated_timeout_s.get("last")
            return None if stated is None else stated + SILENT_MARGIN_S

        return self._retrying(
            lambda channel: stub(channel).NodeWatchResources(request), on_message, silence
        )

    async def snapshot(self, *, deadline_s: float | None = None) -> pb.NodeSnapshot:
        """The agent's state now (unary ``GetSnapshot``; default deadline
        ``snapshot_timeout``). Raises ClientError."""
        if self.closed:
            raise ClientError("client is closed")
        if self._unary_channel is None:
            self._unary_channel = self._open_channel()
        stub = pb_grpc.NodeHealthServiceStub(self._unary_channel)
        try:
            response = await stub.GetSnapshot(
                pb.GetSnapshotRequest(filter=self._filter, node_name=self.node_name),
                timeout=deadline_s or self._snapshot_timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.UNAVAILABLE:
                # The next call gets a new connection, not grpc's reconnect backoff.
                channel, self._unary_channel = self._unary_channel, None
                await channel.close()
            raise ClientError(
                f"GetSnapshot from {self.target}: {_describe(exc)}", code=exc.code()
            ) from exc
        self._readiness = ObservedReadiness(
            readiness=response.snapshot.readiness, received_at=self._clock.monotonic()
        )
        return response.snapshot

    async def close(self) -> None:
        """End any iteration promptly and close the channels. Idempotent."""
        self._closed.set()
        if self._call is not None:
            self._call.cancel()
        for channel in (self._stream_channel, self._unary_channel):
            if channel is not None:
                await channel.close()
        self._unary_channel = None

    def _open_channel(self) -> grpc.aio.Channel:
        if self._credentials is None:
            return grpc.aio.insecure_channel(self.target, options=self._options)
        return grpc.aio.secure_channel(self.target, self._credentials, options=self._options)

    def _request(self) -> pb.WatchRequest:
        request = pb.WatchRequest(
            since_sequence=self._sequence,
            agent_instance_id=self._instance,
            filter=self._filter,
            node_name=self.node_name,
        )
        if self._heartbeat_s is not None:
            request.heartbeat_interval.FromTimedelta(timedelta(seconds=self._heartbeat_s))
        return request

    def _watch_silence(self) -> float | None:
        if self._silence_s is not None:
            return self._silence_s
        period = self._heartbeat_s or self._interval_s
        return None if period is None else SILENT_PERIODS * period + SILENT_MARGIN_S

    def _on_watch(self, message: Any, now: float) -> Event | None:
        kind = message.WhichOneof("event")
        if kind == "snapshot":
            snapshot: pb.NodeSnapshot = message.snapshot
            restarted = self._instance not in ("", snapshot.agent_instance_id)
            self._instance, self._sequence = snapshot.agent_instance_id, snapshot.sequence
            self._interval_s = snapshot.interval.ToTimedelta().total_seconds() or None
            self._observe(snapshot.readiness, now)
            return Snapshot(
                snapshot=snapshot, resync=snapshot.resync, restarted=restarted, received_at=now
            )
        if kind == "cycle":
            cycle: pb.CycleReport = message.cycle
            self._sequence = cycle.sequence
            self._observe(cycle.readiness, now)
            return Cycle(cycle=cycle, received_at=now)
        if kind == "heartbeat":
            heartbeat: pb.Heartbeat = message.heartbeat
            # Not its last_sequence: a cycle sent just after it may not have
            # arrived, and resuming past it would lose that cycle.
            self._instance = self._instance or heartbeat.agent_instance_id
            self._observe(heartbeat.readiness, now)
            return Heartbeat(heartbeat=heartbeat, received_at=now)
        return None  # an event kind from a newer agent: skip it

    def _observe(self, readiness: pb.Readiness, now: float) -> None:
        self._readiness = ObservedReadiness(readiness=readiness, received_at=now)

    async def _retrying(
        self,
        open_call: Callable[[grpc.aio.Channel], _Call],
        on_message: Callable[[Any, float], _E | None],
        silence: Callable[[], float | None],
    ) -> AsyncGenerator[_E | Disconnected, None]:
        if self._busy:
            raise ClientError("this client is already streaming; use one iteration at a time")
        self._busy = True
        closed = asyncio.ensure_future(self._closed.wait())
        attempt = 0
        try:
            while not self._closed.is_set():
                channel = self._stream_channel = self._open_channel()
                call = self._call = open_call(channel)
                try:
                    while True:
                        try:
                            message = await self._read(call, closed, silence())
                        except grpc.aio.AioRpcError as exc:
                            code: grpc.StatusCode | None = exc.code()
                            error = _describe(exc)
                            break
                        except _Silent as exc:
                            code, error = None, str(exc)
                            break
                        if message is _CLOSED:
                            return
                        if message is grpc.aio.EOF:
                            code, error = await call.code(), "stream ended by the agent"
                            break
                        attempt = 0
                        event = on_message(message, self._clock.monotonic())
                        if event is not None:
                            yield event
                finally:
                    self._call = self._stream_channel = None
                    await _end(call, channel)
                if self._closed.is_set():
                    return
                retry_in = self.reconnect_backoff.delay(attempt, self._rng)
                log.info(
                    "stream lost target=%s code=%s error=%r attempt=%d retry_in=%.3f",
                    self.target,
                    code.name if code else "none",
                    error,
                    attempt,
                    retry_in,
                )
                yield Disconnected(
                    error=error,
                    code=code,
                    retry_in=retry_in,
                    attempt=attempt,
                    received_at=self._clock.monotonic(),
                )
                attempt += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(closed), retry_in)
        finally:
            closed.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await closed
            self._busy = False

    async def _read(
        self, call: _Call, closed: asyncio.Future[Any], silence_s: float | None
    ) -> object:
        """The next message, grpc.aio.EOF, or _CLOSED; raises AioRpcError or _Silent."""
        if closed.done():
            return _CLOSED
        read = asyncio.ensure_future(call.read())
        try:
            done, _ = await asyncio.wait(
                {read, closed},
                timeout=None if silence_s is None or math.isinf(silence_s) else silence_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            if not read.done():
                call.cancel()
                read.cancel()
            # Collect its outcome here, so no failure goes unretrieved when closing.
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await read
        if closed in done:  # close() also cancels the call: the read may have ended too
            return _CLOSED
        if read in done:
            return read.result()
        raise _Silent(f"no message for {silence_s:g}s; presuming the stream dead")


async def _end(call: _Call, channel: grpc.aio.Channel) -> None:
    """Cancel ``call`` and close ``channel``, then wait for the call's final status:
    grpc delivers it later, and must not deliver it to an event loop that closed."""
    call.cancel()
    await channel.close()
    await call.code()


def _describe(exc: grpc.aio.AioRpcError) -> str:
    details = exc.details()
    return f"{exc.code().name}: {details}" if details else exc.code().name
