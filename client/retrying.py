"""The connection and the retry loop that capwatch's streaming clients share.

:class:`RetryingClient` holds one target (``host:port`` or ``unix:///path``),
its TLS credentials and channel options, validated up front, and runs a
server-streaming call for ever: on any failure (an error status, the server
ending the stream, or a stream silent for too long) it yields
:class:`~capwatch.client.stream_events.Disconnected`, waits (:mod:`capwatch.kit.backoff`:
exponential, full jitter; ``attempt`` resets whenever a message arrives), opens a new
channel and calls again. What the call is, what it asks for on each attempt
(a resume position) and what each message becomes are the subclass's:
:class:`~capwatch.client.node_health.NodeHealthClient` follows a node agent,
:class:`~capwatch.client.cluster_health.ClusterHealthClient` a controller.

A message that parses but makes no sense (a Duration no timedelta holds, a
negative interval: :class:`MalformedMessage`, raised by the subclass's reading
of it) is a failure like any other: the stream is dropped, one throttled
warning says why, the Disconnected says so (``malformed``), and the client
waits its backoff before calling again; neither it nor the good messages
before it on that stream reset ``attempt``, so a peer whose every stream goes
bad waits longer each time. Never an exception out of the iteration, never a
reconnect loop without backoff.

It never gives up on its own: the consumer stops iterating, cancels, or calls
:meth:`RetryingClient.close`, which ends an iteration at once, even in the
middle of a backoff wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

import grpc
from google.protobuf.duration_pb2 import Duration

from capwatch.api.durations import DurationError, seconds
from capwatch.api.limits import MAX_HEARTBEAT_S, MIN_HEARTBEAT_S
from capwatch.client.channels import SharedChannels
from capwatch.client.stream_events import Disconnected
from capwatch.kit.backoff import LOCAL_CHANNEL_OPTIONS, Backoff, is_local, local_backoff
from capwatch.kit.clock import SystemClock
from capwatch.kit.errors import CapwatchError, ConfigError
from capwatch.kit.throttling import ThrottledLog

log = logging.getLogger(__name__)
# One generator for every client's reconnect jitter (one event loop draws from it): a
# Mersenne Twister each was 2.5 KiB per followed node, 12 MiB at 5,000 nodes.
_JITTER = random.Random()
# One budget for the whole process: however many peers send nonsense, a few lines.
_malformed_log = ThrottledLog(log)

DEFAULT_SNAPSHOT_TIMEOUT_S = 5.0
# A stream is presumed dead after this many heartbeat periods without a message.
SILENT_PERIODS = 3
SILENT_MARGIN_S = 1.0

CHANNEL_OPTIONS: Sequence[tuple[str, Any]] = (
    # Notice a dead server or a cut link on a quiet connection; the agent
    # accepts a ping every 10 s at most.
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    # As much as a server may send (a snapshot of a big node, or of a shard).
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
    # Each reconnect opens a new channel, so this client's backoff is the only
    # one in play; channels must not share (grpc's default) a subchannel still
    # sitting out grpc's own reconnect backoff (1 s and up) after a failure.
    ("grpc.use_local_subchannel_pool", 1),
)


class ClientError(CapwatchError):
    """A call failed (``code`` is its gRPC status, None when it never ran)."""

    def __init__(self, message: str, *, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class MalformedMessage(ClientError):
    """A message that parsed but does not make sense (the subclass's reading of it)."""


def duration_seconds(duration: Duration, field: str) -> float:
    """A Duration a peer sent, in non-negative seconds; MalformedMessage when it is none."""
    try:
        return seconds(duration, field=field)
    except DurationError as exc:
        raise MalformedMessage(str(exc)) from exc


class MonotonicClock(Protocol):
    def monotonic(self) -> float: ...


E = TypeVar("E")
T = TypeVar("T")
Call = grpc.aio.UnaryStreamCall[Any, Any]
_CLOSED = object()


class _Silent(Exception):
    pass


class RetryingClient:
    """One target, its channels, and the retry loop (see the module docstring)."""

    # Who ends a stream, as a Disconnected's error says ("stream ended by the agent").
    peer = "server"

    def __init__(
        self,
        *,
        target: str,
        root_certificates: bytes | None = None,
        private_key: bytes | None = None,
        certificate_chain: bytes | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        clock: MonotonicClock | None = None,
        silence_timeout: float | None = None,
        snapshot_timeout: float = DEFAULT_SNAPSHOT_TIMEOUT_S,
        options: Sequence[tuple[str, Any]] = (),
        channels: SharedChannels | None = None,
    ) -> None:
        """TLS when any certificate bytes or ``credentials`` are given. ``options`` are
        extra channel arguments, overriding :data:`CHANNEL_OPTIONS`. ``channels``: call
        on the channel shared by every client of the target (:mod:`capwatch.client.channels`,
        which then holds the credentials), not on one of this client's own. Raises
        ConfigError."""
        if not target:
            raise ConfigError("target", "must not be empty")
        if (private_key is None) != (certificate_chain is None):
            raise ConfigError("private_key", "private_key and certificate_chain go together")
        tls_bytes = root_certificates is not None or certificate_chain is not None
        if credentials is not None and tls_bytes:
            raise ConfigError("credentials", "give credentials or certificate bytes, not both")
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
        self._local = is_local(target)
        self._credentials = credentials
        local_options = dict(LOCAL_CHANNEL_OPTIONS) if self._local else {}
        self._options = tuple({**dict(CHANNEL_OPTIONS), **local_options, **dict(options)}.items())
        self.backoff = backoff or Backoff()
        self._rng = rng or _JITTER
        self._clock: MonotonicClock = clock or SystemClock()
        self._silence_s = silence_timeout
        self._snapshot_timeout_s = snapshot_timeout
        self._closed = asyncio.Event()
        self._busy = False
        self._call: Call | None = None
        self._stream_channel: grpc.aio.Channel | None = None
        self._unary_channel: grpc.aio.Channel | None = None
        self._channels = channels
        self._shared: grpc.aio.Channel | None = None  # from ``channels``, held until close

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    @property
    def reconnect_backoff(self) -> Backoff:
        """The backoff in effect now: ``backoff``, capped at 1 s on a unix socket."""
        return local_backoff(self.backoff, interval_s=None) if self._local else self.backoff

    async def close(self) -> None:
        """End any iteration promptly and close the channels. Idempotent."""
        self._closed.set()
        if self._call is not None:
            self._call.cancel()
        if self._channels is not None:
            if self._shared is not None:
                self._shared = None
                await self._channels.release(self.target)
            return
        for channel in (self._stream_channel, self._unary_channel):
            if channel is not None:
                await channel.close()
        self._unary_channel = None

    def _check_idle(self) -> None:
        if self._busy:
            raise ClientError("this client is already streaming; use one iteration at a time")

    def _open_channel(self) -> grpc.aio.Channel:
        if self._channels is not None:
            if self._shared is None:
                self._shared = self._channels.acquire(self.target, self._options)
            return self._shared
        if self._credentials is None:
            return grpc.aio.insecure_channel(self.target, options=self._options)
        return grpc.aio.secure_channel(self.target, self._credentials, options=self._options)

    async def _unary(
        self,
        method: str,
        invoke: Callable[[grpc.aio.Channel, float], Awaitable[T]],
        deadline_s: float | None,
    ) -> T:
        """``invoke(channel, timeout)`` on the channel kept for unary calls. Raises
        ClientError naming ``method``; after UNAVAILABLE the next call reconnects at
        once (a new channel, not grpc's reconnect backoff)."""
        if self.closed:
            raise ClientError("client is closed")
        if self._unary_channel is None:
            self._unary_channel = self._open_channel()
        try:
            return await invoke(self._unary_channel, deadline_s or self._snapshot_timeout_s)
        except grpc.aio.AioRpcError as exc:
            unary = self._unary_channel
            if exc.code() is grpc.StatusCode.UNAVAILABLE and unary is not None:
                self._unary_channel = None
                if unary is not self._shared:  # a shared one reconnects by itself
                    await unary.close()
            raise ClientError(
                f"{method} from {self.target}: {describe(exc)}", code=exc.code()
            ) from exc

    async def _retrying(
        self,
        open_call: Callable[[grpc.aio.Channel], Call],
        on_message: Callable[[Any, float], E | None],
        silence: Callable[[], float | None],
    ) -> AsyncGenerator[E | Disconnected, None]:
        """Call, yield ``on_message(message, received_at)`` for each message (None:
        skip it), and on any failure yield Disconnected, wait, call again. ``open_call``
        runs on each attempt, so the request it builds can carry the latest position;
        ``silence()`` is the longest wait for a message (None: no limit)."""
        self._check_idle()
        self._busy = True
        attempt = 0
        try:
            while not self._closed.is_set():
                malformed, failures_before = False, attempt
                channel = self._stream_channel = self._open_channel()
                call = self._call = open_call(channel)
                try:
                    while True:
                        try:
                            message = await self._read(call, silence())
                        except grpc.aio.AioRpcError as exc:
                            code: grpc.StatusCode | None = exc.code()
                            error = describe(exc)
                            break
                        except _Silent as exc:
                            code, error = None, str(exc)
                            break
                        if message is _CLOSED:
                            return
                        if message is grpc.aio.EOF:
                            code, error = await call.code(), f"stream ended by the {self.peer}"
                            break
                        try:
                            event = on_message(message, self._clock.monotonic())
                        except MalformedMessage as exc:
                            # Good messages before it were not a recovery: a peer whose
                            # every stream goes bad waits longer each time.
                            code, error, malformed = None, self._dropped(exc), True
                            attempt = failures_before
                            break
                        attempt = 0
                        if event is not None:
                            yield event
                finally:
                    self._call = self._stream_channel = None
                    await _end(call, None if channel is self._shared else channel)
                if self._closed.is_set():
                    return
                yield (lost := self._lost(code, error, attempt, malformed=malformed))
                attempt += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closed.wait(), lost.retry_in)
        finally:
            self._busy = False

    async def _read(self, call: Call, silence_s: float | None) -> object:
        """The next message, grpc.aio.EOF, or _CLOSED; raises AioRpcError or _Silent.

        Read in the iterating task itself, not in a task of its own raced against the
        close and a timeout: at 5,000 followed nodes those were two tasks, their
        coroutines, contexts and wait sets a node, some 10 MiB. A silence timer and
        :meth:`close` cancel the call instead, and the read ends with the call."""
        if self._closed.is_set():
            return _CLOSED
        silent = False

        def expire() -> None:
            nonlocal silent
            silent = True
            call.cancel()

        timer = None
        if silence_s is not None and not math.isinf(silence_s):
            timer = asyncio.get_running_loop().call_later(silence_s, expire)
        try:
            message = await call.read()
        except (asyncio.CancelledError, grpc.aio.AioRpcError) as exc:
            # A locally cancelled call's read raises CancelledError (or, its status in
            # already, CANCELLED); this task's own cancellation passes through.
            task = asyncio.current_task()
            if isinstance(exc, asyncio.CancelledError) and task is not None and task.cancelling():
                raise
            if self._closed.is_set():
                return _CLOSED
            if silent:
                raise _Silent(f"no message for {silence_s:g}s; presuming the stream dead") from None
            if isinstance(exc, asyncio.CancelledError):
                raise grpc.aio.AioRpcError(
                    grpc.StatusCode.CANCELLED,
                    grpc.aio.Metadata(),
                    grpc.aio.Metadata(),
                    details="the call was cancelled",
                ) from None
            raise
        finally:
            if timer is not None:
                timer.cancel()
        # A message that arrived as the client closed is not delivered.
        return _CLOSED if self._closed.is_set() else message

    def _dropped(self, exc: MalformedMessage) -> str:
        """Why a stream was dropped for a malformed message, said once (throttled)."""
        error = f"malformed message from the {self.peer}: {exc}"
        _malformed_log.warning("stream dropped target=%s: %s", self.target, error)
        return error

    def _lost(
        self, code: grpc.StatusCode | None, error: str, attempt: int, *, malformed: bool
    ) -> Disconnected:
        """What a lost stream tells the consumer, with the backoff the client waits now."""
        retry_in = self.reconnect_backoff.delay(attempt, self._rng)
        log.info(
            "stream lost target=%s code=%s error=%r attempt=%d retry_in=%.3f",
            self.target,
            code.name if code else "none",
            error,
            attempt,
            retry_in,
        )
        return Disconnected(
            error=error,
            code=code,
            retry_in=retry_in,
            attempt=attempt,
            received_at=self._clock.monotonic(),
            malformed=malformed,
        )


def checked_heartbeat(period_s: float | None) -> float | None:
    """``period_s`` if the servers accept it as a heartbeat period (1 s to 1 h; None:
    theirs), so a mistake is a ConfigError here rather than INVALID_ARGUMENT later."""
    if period_s is not None and not MIN_HEARTBEAT_S <= period_s <= MAX_HEARTBEAT_S:
        raise ConfigError(
            "heartbeat_interval", f"must be between {MIN_HEARTBEAT_S}s and {MAX_HEARTBEAT_S:g}s"
        )
    return period_s


def silence_after(period_s: float | None) -> float | None:
    """How long a stream with heartbeats every ``period_s`` may stay silent (None: unknown)."""
    return None if period_s is None else SILENT_PERIODS * period_s + SILENT_MARGIN_S


async def _end(call: Call, channel: grpc.aio.Channel | None) -> None:
    """Cancel ``call`` and close ``channel`` (None: a shared one, left open), then wait for
    the call's final status: grpc delivers it later, and must not deliver it to an event
    loop that closed."""
    call.cancel()
    if channel is not None:
        await channel.close()
    await call.code()


def describe(exc: grpc.aio.AioRpcError) -> str:
    """``CODE: details`` (or the code alone), as every client error says it."""
    details = exc.details()
    return f"{exc.code().name}: {details}" if details else exc.code().name
