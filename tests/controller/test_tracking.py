"""The per-node state machine (controller/tracking.py): discovery and stream events in,
NodeState changes and listener calls out, and the staleness timer of a hung agent.

The tracker's clock is the virtual loop's (tests/controller/virtual_time.py), so its
staleness timers fire at exact instants without real waiting."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from capwatch.controller.conditions import AgentLink, ConditionReason, ConditionStatus
from capwatch.controller.tracking import NodeTracker
from tests.controller.builders import (
    cycle_event,
    device,
    disconnected_event,
    failed_device,
    heartbeat_event,
    report,
    snapshot,
    snapshot_event,
)
from tests.controller.fakes import RecordingListener
from tests.controller.virtual_time import LoopClock

R = ConditionReason
S = ConditionStatus
NODE = "gpu-1"
ADDRESS = "10.0.0.1:50051"


def tracker_and_listener() -> tuple[NodeTracker, RecordingListener, LoopClock]:
    clock = LoopClock()
    listener = RecordingListener()
    return NodeTracker(clock=clock, listeners=[listener]), listener, clock


def reason_of(tracker: NodeTracker, node: str = NODE) -> tuple[ConditionStatus, ConditionReason]:
    state = tracker.get(node)
    assert state is not None
    return state.condition.key


def connected(tracker: NodeTracker, clock: LoopClock, *, age_s: float = 0.5) -> None:
    """NODE discovered at ADDRESS, and its snapshot with an enforced cycle."""
    tracker.target(NODE, ADDRESS)
    last = report(3, devices=[device(0), device(1)])
    tracker.on_event(
        NODE, snapshot_event(snapshot(NODE, last_cycle=last, age_s=age_s), at=clock.monotonic())
    )


@pytest.mark.asyncio
async def test_a_gpu_node_without_an_agent_is_agent_missing() -> None:
    """The node watch's GPU node with no target reads Unknown AgentMissing; seeing it again
    changes nothing."""
    tracker, listener, _ = tracker_and_listener()
    tracker.gpu_node(NODE, present=True)
    tracker.gpu_node(NODE, present=True)
    assert [s.condition.key for s in listener.changes] == [(S.UNKNOWN, R.AGENT_MISSING)]
    assert listener.changes[0].observation.link is AgentLink.MISSING
    assert len(tracker) == 1


@pytest.mark.asyncio
async def test_a_target_is_connecting_until_its_stream_speaks() -> None:
    """A discovered agent is `connecting` (AgentStarting) at its address; the same address
    again is not a change."""
    tracker, listener, _ = tracker_and_listener()
    tracker.target(NODE, ADDRESS)
    tracker.target(NODE, ADDRESS)
    (state,) = listener.changes
    assert state.observation.link is AgentLink.CONNECTING
    assert state.observation.address == ADDRESS
    assert state.condition.key == (S.UNKNOWN, R.AGENT_STARTING)
    assert tracker.target_of(NODE) == ADDRESS
    assert tracker.targets() == {NODE: ADDRESS}


@pytest.mark.asyncio
async def test_a_snapshot_connects_the_node_with_its_last_cycle() -> None:
    """The snapshot's cycle, instance, staleness bound and GPUs are the node's state; the
    cycle ended the reported age before it was received (for detection latency)."""
    tracker, listener, clock = tracker_and_listener()
    tracker.target(NODE, ADDRESS)
    now = clock.monotonic()
    last = report(3, devices=[device(0), device(1)])
    tracker.on_event(
        NODE, snapshot_event(snapshot(NODE, last_cycle=last, age_s=2.0, instance="i-1"), at=now)
    )
    state = listener.changes[-1]
    seen = state.observation
    assert state.condition.key == (S.TRUE, R.CAPS_ENFORCED)
    assert seen.link is AgentLink.CONNECTED
    assert (seen.instance_id, seen.stale_after_s) == ("i-1", 45.0)
    assert seen.cycle is not None
    assert seen.cycle.sequence == 3
    assert seen.cycle.finished_at == now - 2.0
    assert state.cycle_end_at == now - 2.0
    assert [g.index for g in seen.gpus] == [0, 1]
    tracker.close()


@pytest.mark.asyncio
async def test_a_snapshot_before_any_cycle_is_agent_starting() -> None:
    """An agent that has not finished a cycle is connected but AgentStarting; no cycle end."""
    tracker, listener, clock = tracker_and_listener()
    tracker.target(NODE, ADDRESS)
    tracker.on_event(NODE, snapshot_event(snapshot(NODE), at=clock.monotonic()))
    state = listener.changes[-1]
    assert state.observation.link is AgentLink.CONNECTED
    assert state.condition.key == (S.UNKNOWN, R.AGENT_STARTING)
    assert state.cycle_end_at is None


@pytest.mark.asyncio
async def test_a_failed_cycle_turns_the_node_false_and_merges_its_gpus() -> None:
    """A cycle that failed a cap write is False CapWriteFailed; the GPUs it reached replace
    theirs in the node's table, the others keep the snapshot's report."""
    tracker, listener, clock = tracker_and_listener()
    connected(tracker, clock)
    await asyncio.sleep(10)
    now = clock.monotonic()
    tracker.on_event(NODE, cycle_event(report(4, devices=[failed_device(1)], age_s=0.2), at=now))
    state = listener.changes[-1]
    assert state.condition.key == (S.FALSE, R.CAP_WRITE_FAILED)
    assert state.cycle_end_at == pytest.approx(now - 0.2)
    gpus = state.observation.gpus
    assert [(g.index, g.outcome) for g in gpus] == [(0, "enforced"), (1, "failed")]
    tracker.close()


@pytest.mark.asyncio
async def test_a_lost_stream_is_agent_unreachable_until_the_agent_answers() -> None:
    """Disconnected fails closed (Unknown AgentUnreachable, with the error) even though the
    last cycle was enforced; a heartbeat on the new stream reconnects the node."""
    tracker, listener, clock = tracker_and_listener()
    connected(tracker, clock)
    tracker.on_event(NODE, disconnected_event("connection reset", at=clock.monotonic()))
    state = listener.changes[-1]
    assert state.condition.key == (S.UNKNOWN, R.AGENT_UNREACHABLE)
    assert state.observation.link_error == "connection reset"
    assert "connection reset" in state.condition.message
    assert state.observation.cycle is not None  # kept, but not trusted

    tracker.on_event(NODE, heartbeat_event(at=clock.monotonic()))
    state = listener.changes[-1]
    assert state.observation.link is AgentLink.CONNECTED
    assert state.observation.link_error == ""
    assert state.condition.key == (S.TRUE, R.CAPS_ENFORCED)
    tracker.close()


@pytest.mark.asyncio
async def test_a_malformed_message_is_agent_message_malformed_until_the_agent_answers() -> None:
    """A stream the client dropped for a malformed message (a Duration out of range) is
    Unknown with a reason that says so, AgentMessageMalformed, naming the field; the link
    reads unreachable (it is reconnecting). A well-formed answer reconnects the node, and
    a later plain loss of the stream is AgentUnreachable again."""
    tracker, listener, clock = tracker_and_listener()
    connected(tracker, clock)
    error = "malformed message from the agent: snapshot.interval is not a valid Duration"
    tracker.on_event(
        NODE, disconnected_event(error, at=clock.monotonic(), code=None, malformed=True)
    )
    state = listener.changes[-1]
    assert state.condition.key == (S.UNKNOWN, R.AGENT_MESSAGE_MALFORMED)
    assert state.condition.reason.value == "AgentMessageMalformed"
    assert state.condition.message == (
        f"the capwatch agent at {ADDRESS} sent a malformed message; reconnecting: {error}"
    )
    assert state.observation.link is AgentLink.UNREACHABLE

    tracker.on_event(NODE, heartbeat_event(at=clock.monotonic()))
    assert reason_of(tracker) == (S.TRUE, R.CAPS_ENFORCED)
    tracker.on_event(NODE, disconnected_event("connection reset", at=clock.monotonic()))
    assert reason_of(tracker) == (S.UNKNOWN, R.AGENT_UNREACHABLE)
    tracker.close()


@pytest.mark.asyncio
async def test_a_refused_stream_says_refused() -> None:
    """FAILED_PRECONDITION (the agent serves another node) is reported as a refusal."""
    tracker, listener, clock = tracker_and_listener()
    tracker.target(NODE, ADDRESS)
    tracker.on_event(
        NODE,
        disconnected_event(
            "this agent serves node 'gpu-9'",
            at=clock.monotonic(),
            code=grpc.StatusCode.FAILED_PRECONDITION,
        ),
    )
    state = listener.changes[-1]
    assert state.condition.key == (S.UNKNOWN, R.AGENT_UNREACHABLE)
    assert state.observation.link_error == "refused: this agent serves node 'gpu-9'"
    assert "refused: this agent serves node 'gpu-9'" in state.condition.message


@pytest.mark.asyncio
async def test_a_heartbeat_while_connected_changes_nothing() -> None:
    """A heartbeat on a connected stream is not a change: no listener call."""
    tracker, listener, clock = tracker_and_listener()
    connected(tracker, clock)
    listener.clear()
    tracker.on_event(NODE, heartbeat_event(at=clock.monotonic()))
    assert listener.calls == []
    tracker.close()


@pytest.mark.asyncio
async def test_a_snapshot_for_another_node_is_refused_and_its_cycles_ignored() -> None:
    """An agent answering for another node (a recycled pod IP) makes the node unreachable,
    with the other node named; its cycles change nothing until a snapshot for this node."""
    tracker, listener, clock = tracker_and_listener()
    connected(tracker, clock)
    tracker.on_event(NODE, snapshot_event(snapshot("gpu-9"), at=clock.monotonic()))
    state = listener.changes[-1]
    assert state.condition.key == (S.UNKNOWN, R.AGENT_UNREACHABLE)
    assert "'gpu-9'" in state.observation.link_error
    assert state.observation.cycle is None

    listener.clear()
    tracker.on_event(NODE, cycle_event(report(9, devices=[device(0)]), at=clock.monotonic()))
    assert listener.calls == []
    assert reason_of(tracker) == (S.UNKNOWN, R.AGENT_UNREACHABLE)

    last = report(10, devices=[device(0)])
    tracker.on_event(NODE, snapshot_event(snapshot(NODE, last_cycle=last), at=clock.monotonic()))
    assert reason_of(tracker) == (S.TRUE, R.CAPS_ENFORCED)
    tracker.on_event(
        NODE, cycle_event(report(11, devices=[failed_device(0)]), at=clock.monotonic())
    )
    assert reason_of(tracker) == (S.FALSE, R.CAP_WRITE_FAILED)
    tracker.close()


@pytest.mark.asyncio
async def test_a_heartbeat_from_a_misdirected_stream_does_not_connect_the_node() -> None:
    """Nothing a stream answering for another node says counts: its heartbeats do not
    bring the node back from AgentUnreachable."""
    tracker, _, clock = tracker_and_listener()
    connected(tracker, clock)
    tracker.on_event(NODE, snapshot_event(snapshot("gpu-9"), at=clock.monotonic()))
    tracker.on_event(NODE, heartbeat_event(at=clock.monotonic()))
    state = tracker.get(NODE)
    assert state is not None
    assert state.observation.link is AgentLink.UNREACHABLE
    assert state.condition.key == (S.UNKNOWN, R.AGENT_UNREACHABLE)
    assert "'gpu-9'" in state.observation.link_error
    tracker.close()


@pytest.mark.asyncio
async def test_a_snapshot_without_a_node_name_is_accepted() -> None:
    """An agent that does not name its node (an older one) is trusted."""
    tracker, _, clock = tracker_and_listener()
    tracker.target(NODE, ADDRESS)
    last = report(1, devices=[device(0)])
    tracker.on_event(NODE, snapshot_event(snapshot("", last_cycle=last), at=clock.monotonic()))
    assert reason_of(tracker) == (S.TRUE, R.CAPS_ENFORCED)
    tracker.close()


@pytest.mark.asyncio
async def test_an_agent_that_moves_starts_over() -> None:
    """A new address for the node is a new agent: connecting, nothing of the old one kept
    (not its cycle, not a refusal of a misdirected stream)."""
    tracker, listener, clock = tracker_and_listener()
    connected(tracker, clock)
    tracker.on_event(NODE, snapshot_event(snapshot("gpu-9"), at=clock.monotonic()))
    tracker.target(NODE, "10.0.0.2:50051")
    state = listener.changes[-1]
    assert state.observation.link is AgentLink.CONNECTING
    assert state.observation.address == "10.0.0.2:50051"
    assert state.observation.cycle is None
    tracker.on_event(NODE, heartbeat_event(at=clock.monotonic()))
    state = tracker.get(NODE)
    assert state is not None
    assert state.observation.link is AgentLink.CONNECTED
    tracker.close()


@pytest.mark.asyncio
async def test_removing_the_target_of_a_gpu_node_makes_it_agent_missing() -> None:
    """A GPU node whose agent pod went is AgentMissing (it is still tracked)."""
    tracker, listener, clock = tracker_and_listener()
    tracker.gpu_node(NODE, present=True)
    connected(tracker, clock)
    tracker.target(NODE, None)
    state = listener.changes[-1]
    assert state.condition.key == (S.UNKNOWN, R.AGENT_MISSING)
    assert state.observation.link is AgentLink.MISSING
    assert tracker.target_of(NODE) is None
    assert len(tracker) == 1
    tracker.close()


@pytest.mark.asyncio
async def test_removing_the_target_of_a_node_that_is_not_a_gpu_node_forgets_it() -> None:
    """Without the node watch's say-so, a node whose target goes is removed: listeners
    hear node_removed, and later events for it are ignored."""
    tracker, listener, clock = tracker_and_listener()
    connected(tracker, clock)
    tracker.target(NODE, None)
    assert listener.calls[-1] == ("removed", NODE)
    assert tracker.get(NODE) is None
    assert len(tracker) == 0
    listener.clear()
    tracker.on_event(NODE, heartbeat_event(at=clock.monotonic()))
    tracker.on_event(NODE, cycle_event(report(5), at=clock.monotonic()))
    assert listener.calls == []
    assert tracker.get(NODE) is None


@pytest.mark.asyncio
async def test_a_node_leaves_when_it_is_neither_a_gpu_node_nor_a_target() -> None:
    """A GPU node that stops being one stays while its agent is known, and goes with it."""
    tracker, listener, clock = tracker_and_listener()
    tracker.gpu_node(NODE, present=True)
    connected(tracker, clock)
    tracker.gpu_node(NODE, present=False)
    assert tracker.get(NODE) is not None
    tracker.target(NODE, None)
    assert listener.calls[-1] == ("removed", NODE)

    tracker.gpu_node("gpu-2", present=True)
    tracker.gpu_node("gpu-2", present=False)
    assert listener.calls[-1] == ("removed", "gpu-2")
    assert len(tracker) == 0
    tracker.close()


@pytest.mark.asyncio
async def test_every_listener_hears_every_change() -> None:
    """Listeners given at construction and added later all get the same states."""
    tracker, first, clock = tracker_and_listener()
    second = RecordingListener()
    tracker.add_listener(second)
    connected(tracker, clock)
    assert first.calls == second.calls
    assert len(first.calls) == 2
    assert tracker.states() == {NODE: first.changes[-1]}
    tracker.close()


@pytest.mark.asyncio
async def test_a_hung_agent_goes_cycle_stale_on_time_without_a_message() -> None:
    """A connected agent whose last cycle passes its staleness bound (45 s after the cycle
    ended) turns CycleStale by the tracker's own timer, at that instant."""
    tracker, listener, clock = tracker_and_listener()
    connected(tracker, clock, age_s=5.0)
    ended = clock.monotonic() - 5.0
    await asyncio.sleep(39.9)
    assert reason_of(tracker) == (S.TRUE, R.CAPS_ENFORCED)
    await asyncio.sleep(0.2)
    state = listener.changes[-1]
    assert state.condition.key == (S.UNKNOWN, R.CYCLE_STALE)
    assert state.cycle_end_at is None
    assert clock.monotonic() - ended == pytest.approx(45.1)
    tracker.close()


@pytest.mark.asyncio
async def test_heartbeats_do_not_keep_a_hung_agent_fresh() -> None:
    """An agent whose server still heartbeats but whose loop completes no cycle goes
    CycleStale all the same: only a cycle is fresh news."""
    tracker, _, clock = tracker_and_listener()
    connected(tracker, clock, age_s=0.0)
    for _ in range(3):
        await asyncio.sleep(20)
        tracker.on_event(NODE, heartbeat_event(at=clock.monotonic()))
    assert reason_of(tracker) == (S.UNKNOWN, R.CYCLE_STALE)
    tracker.close()


@pytest.mark.asyncio
async def test_each_cycle_rearms_the_staleness_timer() -> None:
    """A new cycle moves the deadline to 45 s after it ended: no CycleStale in between."""
    tracker, listener, clock = tracker_and_listener()
    connected(tracker, clock, age_s=0.0)
    listener.clear()
    for sequence in range(4, 10):
        await asyncio.sleep(30)
        tracker.on_event(NODE, cycle_event(report(sequence, age_s=0.0), at=clock.monotonic()))
    assert all(s.condition.status is S.TRUE for s in listener.changes)
    await asyncio.sleep(45.01)
    assert reason_of(tracker) == (S.UNKNOWN, R.CYCLE_STALE)
    tracker.close()


@pytest.mark.asyncio
async def test_an_unreachable_or_removed_node_has_no_staleness_timer() -> None:
    """The timer is only for connected agents: a lost stream stays AgentUnreachable and
    a removed node is not brought back by its old timer."""
    tracker, listener, clock = tracker_and_listener()
    connected(tracker, clock)
    tracker.on_event(NODE, disconnected_event(at=clock.monotonic()))
    tracker.target("gpu-2", ADDRESS)
    tracker.on_event(
        "gpu-2",
        snapshot_event(snapshot("gpu-2", last_cycle=report(1)), at=clock.monotonic()),
    )
    tracker.target("gpu-2", None)
    listener.clear()
    await asyncio.sleep(100)
    assert listener.calls == []
    assert reason_of(tracker) == (S.UNKNOWN, R.AGENT_UNREACHABLE)
    assert tracker.get("gpu-2") is None


@pytest.mark.asyncio
async def test_close_cancels_the_staleness_timers() -> None:
    """After close() no timer fires."""
    tracker, listener, clock = tracker_and_listener()
    connected(tracker, clock)
    tracker.close()
    listener.clear()
    await asyncio.sleep(100)
    assert listener.calls == []


@pytest.mark.asyncio
async def test_a_cycle_already_stale_when_it_arrives_is_stale_at_once() -> None:
    """A snapshot whose last cycle is older than the bound is CycleStale immediately."""
    tracker, listener, clock = tracker_and_listener()
    connected(tracker, clock, age_s=60.0)
    assert listener.changes[-1].condition.key == (S.UNKNOWN, R.CYCLE_STALE)
    tracker.close()


@pytest.mark.asyncio
async def test_recheck_rederives_the_condition_at_the_clocks_now() -> None:
    """recheck() (what the timer calls) re-reads the condition at the clock's now: before
    the bound the node stays True, after it CycleStale; an untracked node is ignored."""
    tracker, listener, clock = tracker_and_listener()
    connected(tracker, clock)
    tracker.recheck(NODE)
    tracker.recheck("gpu-unknown")
    assert reason_of(tracker) == (S.TRUE, R.CAPS_ENFORCED)
    assert tracker.get("gpu-unknown") is None
    tracker.close()  # no timer: only recheck can notice the time now
    await asyncio.sleep(50)
    assert reason_of(tracker) == (S.TRUE, R.CAPS_ENFORCED)
    tracker.recheck(NODE)
    assert reason_of(tracker) == (S.UNKNOWN, R.CYCLE_STALE)
    assert listener.changes[-1].condition.key == (S.UNKNOWN, R.CYCLE_STALE)
    tracker.close()
