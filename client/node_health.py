"""Subscribe to a node agent's health stream, and stay subscribed.

:class:`NodeHealthClient` turns ``capwatch.v1.NodeHealthService/Watch`` into a
stream of typed events that survives agent restarts and network cuts: on any
failure it yields :class:`Disconnected`, waits (exponential backoff, full
jitter), reconnects and resumes from the last cycle it saw, so the consumer
gets exactly the cycles it missed, or a snapshot marked ``resync`` when the
agent no longer buffers them or restarted. It never gives up on its own: stop
iterating (or call :meth:`NodeHealthClient.close`) to stop. See docs/client.md.

The retry loop is :mod:`capwatch.client.retrying`'s (shared with the controller's
:class:`~capwatch.client.cluster_health.ClusterHealthClient`); the wait between attempts
is :mod:`capwatch.kit.backoff`'s: 0.2 s doubling to 10 s for a network target, at
most one agent interval (and 1 s) on a unix socket.

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

import random
from collections.abc import AsyncGenerator, Sequence
from datetime import timedelta
from typing import Any

import grpc

from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.api.gen.capwatch.v1 import node_health_pb2_grpc as pb_grpc
from capwatch.api.gen.v1 import dra_health_pb2 as v1_pb
from capwatch.api.gen.v1 import dra_health_pb2_grpc as v1_grpc
from capwatch.api.gen.v1alpha1 import dra_health_pb2 as v1alpha1_pb
from capwatch.api.gen.v1alpha1 import dra_health_pb2_grpc as v1alpha1_grpc
from capwatch.client.channels import SharedChannels
from capwatch.client.retrying import (
    CHANNEL_OPTIONS,
    DEFAULT_SNAPSHOT_TIMEOUT_S,
    SILENT_MARGIN_S,
    ClientError,
    MonotonicClock,
    RetryingClient,
    checked_heartbeat,
    duration_seconds,
    silence_after,
)
from capwatch.client.stream_events import (
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
from capwatch.kit.backoff import Backoff, local_backoff
from capwatch.kit.errors import ConfigError

__all__ = [
    "CHANNEL_OPTIONS",
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


class NodeHealthClient(RetryingClient):
    """One agent's stream; one client per node for a controller watching a cluster."""

    peer = "agent"

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
        channels: SharedChannels | None = None,
    ) -> None:
        """``target``: ``host:port`` or ``unix:///path``. ``node_name``: the node the
        agent there must be serving (it refuses a stream for another with
        FAILED_PRECONDITION; "" accepts any). TLS when any certificate
        bytes or ``credentials`` are given. ``heartbeat_interval``: None for the
        agent's cycle interval. ``indexes``/``uuids``: report only these GPUs.
        ``silence_timeout``: give up on a stream that sent nothing for this long
        (default: three heartbeat periods plus a second, once the period is
        known; ``math.inf`` relies on keepalive alone). ``options`` are extra
        channel arguments, overriding :data:`CHANNEL_OPTIONS`. ``channels``: stream
        on the channel every client of the target shares (a controller following
        many nodes at one address: :mod:`capwatch.client.channels`)."""
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
            channels=channels,
        )
        self.node_name = node_name
        self._heartbeat_s = checked_heartbeat(heartbeat_interval)
        self._filter = pb.DeviceFilter(indexes=list(indexes), uuids=list(uuids))
        self._instance = ""
        self._sequence = 0
        self._interval_s: float | None = None
        self._readiness: ObservedReadiness | None = None

    @property
    def position(self) -> Position:
        """The last cycle seen; pass it to :meth:`events` to resume in another client."""
        return Position(instance_id=self._instance, sequence=self._sequence)

    @property
    def last_readiness(self) -> ObservedReadiness | None:
        """The newest readiness any message carried, kept across disconnects."""
        return self._readiness

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
        self._check_idle()
        self._sequence, self._instance = since, instance_id
        return self._retrying(
            lambda channel: pb_grpc.NodeHealthServiceStub(channel).Watch(self._request()),
            self._on_watch,
            self._watch_silence,
        )

    def dra_devices(self, version: DraVersion) -> AsyncGenerator[DraEvent, None]:
        """The DRA-shaped mirror (``NodeWatchResources``): every full device list sent."""
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
        request = pb.GetSnapshotRequest(filter=self._filter, node_name=self.node_name)
        response: pb.GetSnapshotResponse = await self._unary(
            "GetSnapshot",
            lambda channel, timeout: pb_grpc.NodeHealthServiceStub(channel).GetSnapshot(
                request, timeout=timeout
            ),
            deadline_s,
        )
        self._readiness = ObservedReadiness(
            readiness=response.snapshot.readiness, received_at=self._clock.monotonic()
        )
        return response.snapshot

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
        return silence_after(self._heartbeat_s or self._interval_s)

    def _on_watch(self, message: Any, now: float) -> Event | None:
        """The event for ``message``; raises MalformedMessage for one whose Durations are
        none (every one is checked here, so no consumer's ``ToTimedelta()`` can raise)."""
        kind = message.WhichOneof("event")
        if kind == "snapshot":
            snapshot: pb.NodeSnapshot = message.snapshot
            interval_s = duration_seconds(snapshot.interval, "snapshot.interval")
            duration_seconds(snapshot.stale_after, "snapshot.stale_after")
            _check_readiness(snapshot.readiness, "snapshot.readiness")
            if snapshot.HasField("last_cycle"):
                _check_cycle(snapshot.last_cycle, "snapshot.last_cycle")
            restarted = self._instance not in ("", snapshot.agent_instance_id)
            self._instance, self._sequence = snapshot.agent_instance_id, snapshot.sequence
            self._interval_s = interval_s or None
            self._observe(snapshot.readiness, now)
            return Snapshot(
                snapshot=snapshot, resync=snapshot.resync, restarted=restarted, received_at=now
            )
        if kind == "cycle":
            cycle: pb.CycleReport = message.cycle
            _check_cycle(cycle, "cycle")
            self._sequence = cycle.sequence
            self._observe(cycle.readiness, now)
            return Cycle(cycle=cycle, received_at=now)
        if kind == "heartbeat":
            heartbeat: pb.Heartbeat = message.heartbeat
            _check_readiness(heartbeat.readiness, "heartbeat.readiness")
            # Not its last_sequence: a cycle sent just after it may not have
            # arrived, and resuming past it would lose that cycle.
            self._instance = self._instance or heartbeat.agent_instance_id
            self._observe(heartbeat.readiness, now)
            return Heartbeat(heartbeat=heartbeat, received_at=now)
        return None  # an event kind from a newer agent: skip it

    def _observe(self, readiness: pb.Readiness, now: float) -> None:
        self._readiness = ObservedReadiness(readiness=readiness, received_at=now)


def _check_readiness(readiness: pb.Readiness, where: str) -> None:
    for field in ("last_good_cycle_age", "last_cycle_age"):
        if readiness.HasField(field):
            duration_seconds(getattr(readiness, field), f"{where}.{field}")


def _check_cycle(cycle: pb.CycleReport, where: str) -> None:
    duration_seconds(cycle.duration, f"{where}.duration")
    _check_readiness(cycle.readiness, f"{where}.readiness")
