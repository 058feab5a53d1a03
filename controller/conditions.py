"""The Node condition ``GPUPowerCapEnforced``, as a pure function of what a node's stream said.

Positive polarity, like ``Ready``:

======== ==================================================== =============================
status   when                                                  reason
======== ==================================================== =============================
True     the last cycle was enforced, within the staleness     ``CapsEnforced``
         bound
False    the last cycle was not enforced                       the failure's class (below)
Unknown  no fresh answer from the node's agent                 ``AgentStarting`` (no cycle
                                                               yet), ``AgentUnreachable``,
                                                               ``AgentMessageMalformed``,
                                                               ``AgentMissing``, ``CycleStale``
======== ==================================================== =============================

``AgentMessageMalformed`` is a stream the controller dropped because the
agent's message made no sense (a Duration out of range); like an unreachable
agent's, it is retried with backoff.

A failed cycle is classed by its most fundamental failure, in this order:
the pod view was not synced (nothing was reconciled), the GPU count could not
be read, a GPU's identity could not be confirmed, its processes could not be
listed, its cap write failed, a release failed; anything else is
``CycleFailed``. The message names the failing GPUs, at most
:data:`MAX_MESSAGE` characters; it carries no live numbers where the reason
holds, so an unchanged failure is not rewritten every cycle.

Unknown follows the shim's rule of failing closed: from the moment a stream
is lost the node is ``AgentUnreachable`` until the agent answers again; a
cycle that is older than the agent's own staleness bound (3 x its interval,
measured on this process's monotonic clock from the age the agent reported)
is ``CycleStale``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

CONDITION_TYPE = "GPUPowerCapEnforced"
MAX_MESSAGE = 1024


class ConditionStatus(str, Enum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ConditionReason(str, Enum):
    CAPS_ENFORCED = "CapsEnforced"
    # The agent runs in observe mode (agent.mode observe): its cycles succeed, it writes nothing.
    CAPS_OBSERVED = "CapsObserved"
    POD_VIEW_UNSYNCED = "PodViewUnsynced"
    DEVICE_COUNT_FAILED = "DeviceCountFailed"
    GPU_IDENTITY_UNCONFIRMED = "GPUIdentityUnconfirmed"
    PROCESS_LIST_FAILED = "ProcessListFailed"
    CAP_WRITE_FAILED = "CapWriteFailed"
    RELEASE_FAILED = "ReleaseFailed"
    CYCLE_FAILED = "CycleFailed"
    AGENT_STARTING = "AgentStarting"
    AGENT_UNREACHABLE = "AgentUnreachable"
    AGENT_MESSAGE_MALFORMED = "AgentMessageMalformed"
    AGENT_MISSING = "AgentMissing"
    CYCLE_STALE = "CycleStale"


# Most fundamental first: the reason a failed cycle is reported under.
FAILURE_ORDER = (
    ConditionReason.POD_VIEW_UNSYNCED,
    ConditionReason.DEVICE_COUNT_FAILED,
    ConditionReason.GPU_IDENTITY_UNCONFIRMED,
    ConditionReason.PROCESS_LIST_FAILED,
    ConditionReason.CAP_WRITE_FAILED,
    ConditionReason.RELEASE_FAILED,
    ConditionReason.CYCLE_FAILED,
)
# The agent's stable codes (capwatch.v1 CycleReport) and the class each belongs to.
_CYCLE_FAILURE = {
    "pod_view_not_synced": ConditionReason.POD_VIEW_UNSYNCED,
    "device_count_failed": ConditionReason.DEVICE_COUNT_FAILED,
}
_GPU_FAILURE = {
    "uuid_read_failed": ConditionReason.GPU_IDENTITY_UNCONFIRMED,
    "identity_mismatch": ConditionReason.GPU_IDENTITY_UNCONFIRMED,
    "identity_unconfirmed": ConditionReason.GPU_IDENTITY_UNCONFIRMED,
    "process_list_failed": ConditionReason.PROCESS_LIST_FAILED,
    "write_failed": ConditionReason.CAP_WRITE_FAILED,
    "release_failed": ConditionReason.RELEASE_FAILED,
    "release_deferred": ConditionReason.RELEASE_FAILED,
}


class AgentLink(str, Enum):
    """Where the controller stands with a node's agent."""

    MISSING = "missing"  # no agent is known for the node (no pod, no target)
    CONNECTING = "connecting"  # an agent is known; its stream has said nothing yet
    CONNECTED = "connected"  # the stream is up
    UNREACHABLE = "unreachable"  # the stream was lost (or refused); reconnecting


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuSummary:
    """One GPU as the node's latest cycle that reached it reported it."""

    index: int
    uuid: str
    healthy: bool | None  # None: unknown
    outcome: str  # enforced, idle, released, failed, observed, left
    reason: str  # the agent's stable code (ok, write_failed, ...)
    message: str
    applied_watts: int | None = None
    faults: tuple[str, ...] = ()  # summaries of its active device faults (XID 79, ...)
    fault_kinds: tuple[str, ...] = ()  # their categories (xid, gpu_lost, ...)
    # (driver, pool, device): the device a ResourceSlice of the node names it as, while
    # it has a fault (None: no fault, or no slice names it).
    dra_device: tuple[str, str, str] | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class CycleSummary:
    """The node's latest cycle, as much of it as the condition uses: ``gpus`` are the GPUs
    it reached (none when it aborted)."""

    sequence: int
    enforced: bool
    abort_reason: str  # "" when the cycle did not abort
    failure_kinds: tuple[str, ...]
    failure_summary: str
    gpus: tuple[GpuSummary, ...]
    # When it finished, on this process's monotonic clock (received at, less the
    # age the agent reported); and the agent's wall clock, for humans.
    finished_at: float
    finished_wall: float
    observe: bool = False  # the agent writes nothing (observe mode)


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeObservation:
    """Everything the controller knows of one node's agent, at one moment."""

    node: str
    link: AgentLink
    address: str = ""
    link_error: str = ""  # why the stream is down, when it is
    # The stream is down because the agent sent a malformed message (link UNREACHABLE).
    link_malformed: bool = False
    instance_id: str = ""
    stale_after_s: float | None = None  # from the agent's snapshot
    cycle: CycleSummary | None = None
    # Every GPU as the latest report that reached it says (for people, not the condition).
    gpus: tuple[GpuSummary, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Condition:
    status: ConditionStatus
    reason: ConditionReason
    message: str

    @property
    def key(self) -> tuple[ConditionStatus, ConditionReason]:
        """What a change of writes the Node for (a message-only change waits)."""
        return (self.status, self.reason)


def condition_of(observation: NodeObservation, now: float) -> Condition:
    """The condition for ``observation`` at monotonic instant ``now``."""
    link = observation.link
    if link is AgentLink.MISSING:
        return _unknown(ConditionReason.AGENT_MISSING, "no capwatch agent is running on this node")
    if link is AgentLink.UNREACHABLE:
        where = f" at {observation.address}" if observation.address else ""
        error = f": {observation.link_error}" if observation.link_error else ""
        if observation.link_malformed:
            return _unknown(
                ConditionReason.AGENT_MESSAGE_MALFORMED,
                f"the capwatch agent{where} sent a malformed message; reconnecting{error}",
            )
        return _unknown(
            ConditionReason.AGENT_UNREACHABLE, f"the capwatch agent{where} is unreachable{error}"
        )
    cycle = observation.cycle
    if cycle is None:
        return _unknown(
            ConditionReason.AGENT_STARTING, "the capwatch agent has not completed a cycle yet"
        )
    bound = observation.stale_after_s
    if bound is not None and now - cycle.finished_at >= bound:
        return _unknown(
            ConditionReason.CYCLE_STALE,
            f"the capwatch agent has completed no cycle within its staleness bound ({bound:g}s)",
        )
    if cycle.enforced and cycle.observe:
        # The condition's question is whether caps are enforced: in observe mode they are not.
        would = sum(1 for g in cycle.gpus if g.outcome == "observed")
        return Condition(
            status=ConditionStatus.FALSE,
            reason=ConditionReason.CAPS_OBSERVED,
            message=f"observe mode, nothing written; {would} of {len(cycle.gpus)} GPUs "
            "would be capped or released",
        )
    if cycle.enforced:
        capped = sum(1 for g in cycle.gpus if g.outcome == "enforced")
        return Condition(
            status=ConditionStatus.TRUE,
            reason=ConditionReason.CAPS_ENFORCED,
            message=f"power caps enforced; {capped} of {len(cycle.gpus)} GPUs capped",
        )
    return Condition(
        status=ConditionStatus.FALSE, reason=failure_reason(cycle), message=failure_message(cycle)
    )


def failure_reason(cycle: CycleSummary) -> ConditionReason:
    """The class of a failed cycle's most fundamental failure."""
    found = {_CYCLE_FAILURE.get(cycle.abort_reason, ConditionReason.CYCLE_FAILED)}
    if not cycle.abort_reason:
        found = {_CYCLE_FAILURE.get(k, ConditionReason.CYCLE_FAILED) for k in cycle.failure_kinds}
    found |= {
        _GPU_FAILURE.get(g.reason, ConditionReason.CYCLE_FAILED)
        for g in cycle.gpus
        if g.outcome == "failed"
    }
    return next((r for r in FAILURE_ORDER if r in found), ConditionReason.CYCLE_FAILED)


def failure_message(cycle: CycleSummary) -> str:
    """Which GPUs failed and how, bounded; cycle-level failures first."""
    parts: list[str] = []
    if cycle.abort_reason:
        parts.append(f"cycle aborted ({cycle.abort_reason}): no GPU was reconciled")
    parts += [k for k in cycle.failure_kinds if k != cycle.abort_reason]
    for gpu in cycle.gpus:
        if gpu.outcome == "failed":
            label = f"gpu{gpu.index} ({gpu.uuid})" if gpu.uuid else f"gpu{gpu.index}"
            parts.append(f"{label}: {gpu.reason}: {gpu.message}")
    return bounded("; ".join(parts) or cycle.failure_summary or "the cycle was not enforced")


def bounded(message: str, limit: int = MAX_MESSAGE) -> str:
    """``message`` cut to ``limit`` characters, saying it was cut."""
    if len(message) <= limit:
        return message
    suffix = " ... (truncated)"
    return message[: limit - len(suffix)] + suffix


def _unknown(reason: ConditionReason, message: str) -> Condition:
    return Condition(status=ConditionStatus.UNKNOWN, reason=reason, message=bounded(message))


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeCondition:
    """``GPUPowerCapEnforced`` as a Node carries it (times are wall-clock seconds)."""

    status: ConditionStatus
    reason: str
    message: str
    last_transition_wall: float
    last_heartbeat_wall: float

    @property
    def key(self) -> tuple[str, str]:
        return (self.status.value, self.reason)
