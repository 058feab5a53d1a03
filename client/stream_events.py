"""What :class:`capwatch.client.node_health.NodeHealthClient` and
:class:`capwatch.client.cluster_health.ClusterHealthClient` yield, as plain typed values.

Each event wraps the protobuf message it came from and the client's monotonic
time of receipt, so a consumer can age what the agent (or the controller)
reported without trusting either machine's wall clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import grpc

from capwatch.api.gen.capwatch.v1 import cluster_health_pb2 as cpb
from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.api.gen.v1 import dra_health_pb2 as v1_pb
from capwatch.api.gen.v1alpha1 import dra_health_pb2 as v1alpha1_pb


class DraVersion(str, Enum):
    """A version of the kubelet's DRA resource-health API (both are served)."""

    V1 = "v1"
    V1ALPHA1 = "v1alpha1"


# Events. ``received_at`` is the client's monotonic clock when the message
# arrived (or the failure was noticed). Ages inside a message were measured by
# the agent when it sent it; add the time since ``received_at`` to age them.


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """The agent's whole state: first on a new stream, and whenever resync is set.

    ``resync``: cycles this client asked to resume from are gone (no longer
    buffered, or another agent instance); replace all state with this one.
    ``restarted``: it comes from a different agent instance than the
    messages before it (sequence numbers restarted).
    """

    snapshot: pb.NodeSnapshot
    resync: bool
    restarted: bool
    received_at: float


@dataclass(frozen=True, kw_only=True)
class Cycle:
    """One completed reconcile cycle, in sequence order, none skipped or repeated."""

    cycle: pb.CycleReport
    received_at: float


@dataclass(frozen=True, kw_only=True)
class Heartbeat:
    """The agent is alive and has no new cycle; carries readiness as of sending."""

    heartbeat: pb.Heartbeat
    received_at: float


@dataclass(frozen=True, kw_only=True)
class Disconnected:
    """The stream failed or ended; the client reconnects after ``retry_in`` seconds.

    ``code`` is the gRPC status the call ended with (OK when the agent or the
    controller ended it, e.g. on shutdown), None when the client gave up on a
    silent stream or on a malformed message.
    ``attempt`` counts failures since the last message (0 for the first); a
    malformed message is a failure, not a message.
    ``malformed``: the client dropped the stream because a message made no sense
    (a Duration out of range: ``error`` names the field).
    """

    error: str
    code: grpc.StatusCode | None
    retry_in: float
    attempt: int
    received_at: float
    malformed: bool = False


@dataclass(frozen=True, kw_only=True)
class DeviceList:
    """A full DRA device list (``NodeWatchResourcesResponse``) of ``version``."""

    response: v1_pb.NodeWatchResourcesResponse | v1alpha1_pb.NodeWatchResourcesResponse
    version: DraVersion
    received_at: float


@dataclass(frozen=True, kw_only=True)
class ClusterSnapshot:
    """Every node of the controller's shard: first on a new stream, and on a resync.

    ``resync``: the updates this client asked to resume from are gone (no longer
    buffered, another controller instance, or the stream fell behind); replace
    every node with these. ``restarted``: it comes from a different controller
    instance than the messages before it (update sequences restarted).
    ``snapshot`` is whole: the controller sends a big shard in ``pages`` (1,000
    nodes each, ``more`` set on all but the last), joined here.
    """

    snapshot: cpb.ClusterSnapshot
    resync: bool
    restarted: bool
    received_at: float
    pages: tuple[cpb.ClusterSnapshot, ...] = ()  # as received; () when it came whole


@dataclass(frozen=True, kw_only=True)
class NodeUpdate:
    """One node whose condition, agent link or GPUs changed (or that left the shard:
    ``update.removed``), in sequence order, none skipped or repeated."""

    update: cpb.NodeUpdate
    received_at: float


@dataclass(frozen=True, kw_only=True)
class ClusterHeartbeat:
    """The controller is alive and has no new update; says its shard and leadership."""

    heartbeat: cpb.ClusterHeartbeat
    received_at: float


Event = Snapshot | Cycle | Heartbeat | Disconnected
DraEvent = DeviceList | Disconnected
ClusterEvent = ClusterSnapshot | NodeUpdate | ClusterHeartbeat | Disconnected


@dataclass(frozen=True, kw_only=True)
class Position:
    """Where a stream resumes: after ``sequence`` of agent (or controller) instance
    ``instance_id``."""

    instance_id: str  # "" when not known yet
    sequence: int


@dataclass(frozen=True, kw_only=True)
class ObservedReadiness:
    """The agent's latest readiness and when this client received it."""

    readiness: pb.Readiness
    received_at: float

    def last_good_cycle_age(self, now: float) -> float | None:
        """Seconds since the last enforced cycle, as of ``now`` (None: never one)."""
        return self._age("last_good_cycle_age", now)

    def last_cycle_age(self, now: float) -> float | None:
        """Seconds since the last completed cycle, as of ``now`` (None: never one)."""
        return self._age("last_cycle_age", now)

    def _age(self, field: str, now: float) -> float | None:
        if not self.readiness.HasField(field):  # type: ignore[arg-type]
            return None
        reported: float = getattr(self.readiness, field).ToTimedelta().total_seconds()
        return reported + max(0.0, now - self.received_at)
