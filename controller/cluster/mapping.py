"""The cluster stream's messages from the controller's node states: pure mappers.

Ages (the latest cycle's) are measured at the instant given, on this
process's monotonic clock; the agent's wall-clock time of the cycle is passed
through for humans.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from capwatch.api.gen.capwatch.v1 import cluster_health_pb2 as cpb
from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.controller.conditions import AgentLink, ConditionStatus, GpuSummary
from capwatch.controller.tracking import NodeState

CONDITION_STATUS = {
    ConditionStatus.TRUE: cpb.CONDITION_STATUS_TRUE,
    ConditionStatus.FALSE: cpb.CONDITION_STATUS_FALSE,
    ConditionStatus.UNKNOWN: cpb.CONDITION_STATUS_UNKNOWN,
}
AGENT_LINK = {
    AgentLink.MISSING: cpb.AGENT_LINK_MISSING,
    AgentLink.CONNECTING: cpb.AGENT_LINK_CONNECTING,
    AgentLink.CONNECTED: cpb.AGENT_LINK_CONNECTED,
    AgentLink.UNREACHABLE: cpb.AGENT_LINK_UNREACHABLE,
}
OUTCOME = {
    "enforced": pb.OUTCOME_ENFORCED,
    "idle": pb.OUTCOME_IDLE,
    "released": pb.OUTCOME_RELEASED,
    "failed": pb.OUTCOME_FAILED,
    "observed": pb.OUTCOME_OBSERVED,
    "left": pb.OUTCOME_LEFT,
}
HEALTH = {
    True: pb.DEVICE_HEALTH_HEALTHY,
    False: pb.DEVICE_HEALTH_UNHEALTHY,
    None: pb.DEVICE_HEALTH_UNKNOWN,
}


def gpu(summary: GpuSummary) -> cpb.GpuSummary:
    message = cpb.GpuSummary(
        index=summary.index,
        uuid=summary.uuid,
        health=HEALTH[summary.healthy],
        outcome=OUTCOME.get(summary.outcome, pb.OUTCOME_UNSPECIFIED),
        reason=summary.reason,
        message=summary.message,
        faults=summary.faults,
    )
    if summary.applied_watts is not None:
        message.applied_watts = summary.applied_watts
    return message


def node_health(state: NodeState, *, now: float) -> cpb.NodeHealth:
    """``state`` as the stream shows it, its cycle aged at monotonic instant ``now``."""
    seen, condition = state.observation, state.condition
    message = cpb.NodeHealth(
        node_name=seen.node,
        condition=cpb.NodeCondition(
            status=CONDITION_STATUS[condition.status],
            reason=condition.reason.value,
            message=condition.message,
        ),
        agent_link=AGENT_LINK[seen.link],
        agent_address=seen.address,
        agent_error=seen.link_error,
        agent_instance_id=seen.instance_id,
        gpus=[gpu(g) for g in seen.gpus],
    )
    cycle = seen.cycle
    if cycle is not None:
        message.last_cycle_sequence = cycle.sequence
        message.last_cycle_enforced = cycle.enforced
        message.last_cycle_age.FromTimedelta(timedelta(seconds=max(0.0, now - cycle.finished_at)))
        message.last_cycle_finished.FromNanoseconds(int(cycle.finished_wall * 1e9))
    return message


def change_key(state: NodeState) -> tuple[object, ...]:
    """What a cluster-stream subscriber is told about when it changes: not every cycle
    (its sequence and age), but the condition, the link and each GPU's outcome."""
    seen = state.observation
    cycle = seen.cycle
    return (
        state.condition,
        seen.link,
        seen.address,
        seen.link_error,
        seen.instance_id,
        None if cycle is None else cycle.enforced,
        seen.gpus,
    )


def shard(*, index: int, count: int, lease_name: str, holder: str, leading: bool) -> cpb.Shard:
    return cpb.Shard(
        index=index, count=count, lease_name=lease_name, holder=holder, leading=leading
    )


def snapshot(
    states: Sequence[NodeState],
    *,
    now: float,
    wall: float,
    instance_id: str,
    sequence: int,
    shard_info: cpb.Shard,
    resync: bool = False,
    more: bool = False,
) -> cpb.ClusterSnapshot:
    """One snapshot message of ``states`` (in the order given); ``more``: others follow."""
    message = cpb.ClusterSnapshot(
        controller_instance_id=instance_id,
        shard=shard_info,
        sequence=sequence,
        nodes=[node_health(s, now=now) for s in states],
        resync=resync,
        more=more,
    )
    message.time.FromNanoseconds(int(wall * 1e9))
    return message
