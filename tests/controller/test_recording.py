"""Events on Nodes (controller/writes/recorder.py): one per transition of the condition, Warning
to False or Unknown, Normal back to True, none for a node first seen True, deduplicated
within the window, fenced like the condition writes, best effort."""

from __future__ import annotations

import pytest

from capwatch.controller.conditions import (
    Condition,
    ConditionReason,
    ConditionStatus,
    NodeCondition,
)
from capwatch.controller.errors import ApiError, DeadlinePassed
from capwatch.controller.writes.recorder import DEDUPE_WINDOW_S, EventRecorder, EventType
from capwatch.kit.clock import FakeClock
from capwatch.kube.wire import WRITE_TIMEOUT_S
from tests.controller.fakes import FakeEventApi, ManualFence

R = ConditionReason
S = ConditionStatus
NODE = "gpu-1"


def condition(status: ConditionStatus, reason: ConditionReason, message: str = "m") -> Condition:
    return Condition(status=status, reason=reason, message=message)


TRUE = condition(S.TRUE, R.CAPS_ENFORCED, "power caps enforced; 8 of 8 GPUs capped")
WRITE_FAILED = condition(S.FALSE, R.CAP_WRITE_FAILED, "gpu1 (GPU-1): write_failed: no")
RELEASE_FAILED = condition(S.FALSE, R.RELEASE_FAILED)
UNREACHABLE = condition(S.UNKNOWN, R.AGENT_UNREACHABLE, "unreachable")


def carried(c: Condition) -> NodeCondition:
    return NodeCondition(
        status=c.status,
        reason=c.reason.value,
        message=c.message,
        last_transition_wall=0.0,
        last_heartbeat_wall=0.0,
    )


class Observer:
    def __init__(self) -> None:
        self.results: list[str] = []

    def event(self, *, result: str) -> None:
        self.results.append(result)


class Rig:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.api = FakeEventApi(clock=self.clock)
        self.fence = ManualFence(10.0, clock=self.clock)
        self.observer = Observer()
        self.recorder = EventRecorder(
            api=self.api, fence=self.fence, clock=self.clock, observer=self.observer
        )
        self._previous: dict[str, Condition | None] = {}

    async def to(self, c: Condition, *, node: str = NODE) -> None:
        """The node's condition was just written as ``c`` (from what it was before)."""
        before = self._previous.get(node)
        await self.recorder.transition(
            node, c, previous=None if before is None else carried(before)
        )
        self._previous[node] = c


@pytest.mark.asyncio
async def test_going_false_is_a_warning_with_the_conditions_reason_and_message() -> None:
    """True -> False posts one Warning on the Node: the condition's reason and message,
    stamped with the wall clock."""
    rig = Rig()
    await rig.to(TRUE)
    await rig.to(WRITE_FAILED)
    (event,) = rig.api.events
    assert (event.node, event.type, event.reason) == (NODE, EventType.WARNING, "CapWriteFailed")
    assert event.message == WRITE_FAILED.message
    assert event.wall == rig.clock.wall()
    assert rig.observer.results == ["posted"]


@pytest.mark.asyncio
async def test_going_unknown_is_a_warning_and_back_to_true_is_normal() -> None:
    """Unknown is a Warning too; a return to True is Normal CapsEnforced."""
    rig = Rig()
    await rig.to(TRUE)
    await rig.to(UNREACHABLE)
    await rig.to(TRUE)
    assert rig.api.said() == [
        (NODE, "Warning", "AgentUnreachable"),
        (NODE, "Normal", "CapsEnforced"),
    ]


@pytest.mark.asyncio
async def test_a_node_first_seen_true_gets_no_event() -> None:
    """Nothing changed for a node first seen True (a fresh start, a new leader); a node
    first seen failing is worth a Warning."""
    rig = Rig()
    await rig.to(TRUE)
    await rig.to(WRITE_FAILED, node="gpu-2")
    assert rig.api.said() == [("gpu-2", "Warning", "CapWriteFailed")]
    assert rig.observer.results == ["posted"]


@pytest.mark.asyncio
async def test_observe_mode_is_normal_and_quiet_when_first_seen() -> None:
    """CapsObserved is False by the operator's choice: a node first seen observing gets no
    Event, and one that moves between observing and enforcing gets Normal ones."""
    observed = condition(S.FALSE, R.CAPS_OBSERVED, "observe mode, nothing written")
    rig = Rig()
    await rig.to(observed)
    await rig.to(TRUE)
    await rig.to(observed)
    assert rig.api.said() == [(NODE, "Normal", "CapsEnforced"), (NODE, "Normal", "CapsObserved")]


@pytest.mark.asyncio
async def test_each_change_of_reason_is_its_own_event() -> None:
    """False for one reason, then another: two Warnings."""
    rig = Rig()
    await rig.to(WRITE_FAILED)
    await rig.to(RELEASE_FAILED)
    assert rig.api.said() == [
        (NODE, "Warning", "CapWriteFailed"),
        (NODE, "Warning", "ReleaseFailed"),
    ]


@pytest.mark.asyncio
async def test_the_same_event_again_within_the_window_is_not_posted() -> None:
    """The same type and reason for the node within DEDUPE_WINDOW_S is deduplicated (and
    counted so); after the window it is posted again."""
    rig = Rig()
    await rig.to(WRITE_FAILED)
    rig.clock.advance(DEDUPE_WINDOW_S - 1)
    await rig.recorder.transition(NODE, WRITE_FAILED, previous=carried(UNREACHABLE))
    assert len(rig.api.events) == 1
    assert rig.observer.results == ["posted", "deduplicated"]
    rig.clock.advance(1)
    await rig.recorder.transition(NODE, WRITE_FAILED, previous=carried(UNREACHABLE))
    assert len(rig.api.events) == 2


@pytest.mark.asyncio
async def test_a_node_flapping_between_two_states_says_each_once() -> None:
    """True and False alternating within the window: the condition is written each time,
    but the Events say each transition once."""
    rig = Rig()
    await rig.to(TRUE)
    for _ in range(5):
        await rig.to(WRITE_FAILED)
        rig.clock.advance(10)
        await rig.to(TRUE)
        rig.clock.advance(10)
    assert rig.api.said() == [
        (NODE, "Warning", "CapWriteFailed"),
        (NODE, "Normal", "CapsEnforced"),
    ]
    assert rig.observer.results.count("deduplicated") == 8


@pytest.mark.asyncio
async def test_deduplication_is_per_node() -> None:
    """The same Event on two nodes is two Events."""
    rig = Rig()
    await rig.to(WRITE_FAILED)
    await rig.to(WRITE_FAILED, node="gpu-2")
    assert len(rig.api.events) == 2


@pytest.mark.asyncio
async def test_forget_lets_the_next_event_through() -> None:
    """A forgotten node (removed) starts again with no deduplication history."""
    rig = Rig()
    await rig.to(WRITE_FAILED)
    rig.recorder.forget(NODE)
    await rig.recorder.transition(NODE, WRITE_FAILED, previous=carried(TRUE))
    assert len(rig.api.events) == 2


@pytest.mark.asyncio
async def test_a_fenced_event_is_not_posted_nor_remembered() -> None:
    """Without a write budget nothing is posted (counted as fenced); that Event is not
    taken as said, so the same transition posts once the fence reopens."""
    rig = Rig()
    rig.fence.budget = 0.0
    await rig.to(WRITE_FAILED)
    assert rig.api.events == []
    assert rig.observer.results == ["fenced"]
    rig.fence.budget = 10.0
    await rig.recorder.transition(NODE, WRITE_FAILED, previous=carried(TRUE))
    assert rig.api.said() == [(NODE, "Warning", "CapWriteFailed")]


@pytest.mark.asyncio
async def test_a_failed_post_is_counted_not_raised_nor_remembered() -> None:
    """An ApiError is logged and counted as failed, never raised to the writer; the next
    post of the same Event is tried."""
    rig = Rig()
    rig.api.failures = [ApiError("forbidden", status=403)]
    await rig.to(WRITE_FAILED)
    assert rig.observer.results == ["failed"]
    await rig.recorder.transition(NODE, WRITE_FAILED, previous=carried(TRUE))
    assert rig.observer.results == ["failed", "posted"]
    assert len(rig.api.events) == 1


@pytest.mark.parametrize(("budget", "deadline"), [(2.5, 2.5), (60.0, WRITE_TIMEOUT_S)])
@pytest.mark.asyncio
async def test_an_event_post_never_outlives_the_fence(budget: float, deadline: float) -> None:
    """The post's deadline is the fence's budget, at most the request timeout."""
    rig = Rig()
    rig.fence.budget = budget
    await rig.to(WRITE_FAILED)
    assert rig.api.deadlines == [deadline]


@pytest.mark.asyncio
async def test_an_event_not_sent_past_its_deadline_is_counted_expired_and_not_retried() -> None:
    """An Event the API client dropped because the fence's deadline had passed before it
    could go out is counted ``expired`` (not ``failed``), and, best effort, not retried."""
    rig = Rig()
    rig.api.failures.append(DeadlinePassed("POST events: not sent"))
    await rig.to(WRITE_FAILED)
    assert rig.observer.results == ["expired"]
    assert rig.api.events == []
    assert rig.fence.losses == []
