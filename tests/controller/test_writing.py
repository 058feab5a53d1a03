"""The condition writer (controller/writing.py): what is written to a Node and when --
only on a change of status or reason, a heartbeat, fenced by the lease, retried with
backoff, one write per node at a time with its latest state -- and what it reports.

Time is the virtual loop's: retries, Retry-After and heartbeats happen at exact instants."""

from __future__ import annotations

import asyncio
import itertools
import random

import pytest

from controller.conditions import (
    AgentLink,
    Condition,
    ConditionReason,
    ConditionStatus,
    NodeObservation,
)
from controller.errors import ApiError
from controller.recording import EventRecorder
from controller.tracking import NodeState
from controller.writing import (
    REQUEST_TIMEOUT_S,
    RETRY_INITIAL_S,
    RETRY_MAX_S,
    ConditionWriter,
    NodeCondition,
)
from tests.controller.fakes import FakeConditionApi, FakeEventApi, ManualFence
from tests.controller.virtual_time import LoopClock

R = ConditionReason
S = ConditionStatus
NODE = "gpu-1"
TRUE = (S.TRUE, R.CAPS_ENFORCED)
WRITE_FAILED = (S.FALSE, R.CAP_WRITE_FAILED)
RELEASE_FAILED = (S.FALSE, R.RELEASE_FAILED)
UNREACHABLE = (S.UNKNOWN, R.AGENT_UNREACHABLE)


class Observer:
    def __init__(self) -> None:
        self.results: list[tuple[str, float | None]] = []

    def written(self, *, result: str, latency_s: float | None) -> None:
        self.results.append((result, latency_s))

    def count(self, result: str) -> int:
        return sum(1 for r, _ in self.results if r == result)


class Rig:
    def __init__(self, *, heartbeat_s: float = 300.0, workers: int = 4, start: bool = True) -> None:
        self.clock = LoopClock()
        self.api = FakeConditionApi()
        self.events = FakeEventApi()
        self.fence = ManualFence(10.0)
        self.observer = Observer()
        self.writer = ConditionWriter(
            api=self.api,
            events=EventRecorder(api=self.events, fence=self.fence, clock=self.clock),
            fence=self.fence,
            clock=self.clock,
            heartbeat_s=heartbeat_s,
            workers=workers,
            observer=self.observer,
            rng=random.Random(7),
        )
        if start:
            self.writer.start()

    def state(
        self,
        key: tuple[ConditionStatus, ConditionReason],
        message: str = "m",
        *,
        node: str = NODE,
        cycle_age: float | None = None,
    ) -> NodeState:
        """The tracker's state for ``node`` with condition ``key``, its cycle having ended
        ``cycle_age`` seconds ago (None: not a cycle's doing)."""
        end = None if cycle_age is None else self.clock.monotonic() - cycle_age
        return NodeState(
            observation=NodeObservation(node=node, link=AgentLink.CONNECTED),
            condition=Condition(status=key[0], reason=key[1], message=message),
            cycle_end_at=end,
        )

    def change(
        self,
        key: tuple[ConditionStatus, ConditionReason],
        message: str = "m",
        *,
        node: str = NODE,
        cycle_age: float | None = None,
    ) -> None:
        self.writer.node_changed(self.state(key, message, node=node, cycle_age=cycle_age))

    def carried(
        self, key: tuple[ConditionStatus, ConditionReason], *, heartbeat_age: float = 0.0
    ) -> NodeCondition:
        """What a Node carries, as the node watch reads it."""
        wall = self.clock.wall()
        return NodeCondition(
            status=key[0],
            reason=key[1].value,
            message="from the API",
            last_transition_wall=wall - 1000,
            last_heartbeat_wall=wall - heartbeat_age,
        )

    def keys(self, node: str = NODE) -> list[tuple[str, str]]:
        return [c.key for c in self.api.written(node)]


def key(k: tuple[ConditionStatus, ConditionReason]) -> tuple[str, str]:
    return (k[0].value, k[1].value)


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_a_new_condition_is_written_with_both_times_now() -> None:
    """The first state of a node is written: status, reason, message, and transition and
    heartbeat times both the wall clock now; the write reports ok."""
    rig = Rig()
    rig.change(WRITE_FAILED, "gpu1: write_failed")
    await settle()
    (written,) = rig.api.written(NODE)
    now = rig.clock.wall()
    assert written == NodeCondition(
        status=S.FALSE,
        reason="CapWriteFailed",
        message="gpu1: write_failed",
        last_transition_wall=now,
        last_heartbeat_wall=now,
    )
    assert rig.writer.written(NODE) == written
    assert rig.observer.results == [("ok", None)]
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_a_message_only_change_waits_for_the_heartbeat() -> None:
    """Same status and reason with a new message is not written; the heartbeat, due
    heartbeat_s after the last write, carries the latest message, the same transition
    time and a new heartbeat time."""
    rig = Rig(heartbeat_s=300.0)
    rig.change(WRITE_FAILED, "gpu1 failed")
    await settle()
    first = rig.api.written(NODE)[0]
    await asyncio.sleep(100)
    rig.change(WRITE_FAILED, "gpu1 and gpu2 failed")
    await asyncio.sleep(199)
    assert len(rig.api.written(NODE)) == 1
    await asyncio.sleep(11)  # the heartbeat check runs every min(10 s, heartbeat_s / 10)
    (_, beat) = rig.api.written(NODE)
    assert beat.message == "gpu1 and gpu2 failed"
    assert beat.last_transition_wall == first.last_transition_wall
    assert 300 <= beat.last_heartbeat_wall - first.last_heartbeat_wall <= 310
    assert rig.events.said() == [(NODE, "Warning", "CapWriteFailed")]  # a heartbeat says nothing
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_heartbeats_repeat_every_heartbeat_period() -> None:
    """An unchanged condition is rewritten once a period, and only then."""
    rig = Rig(heartbeat_s=60.0)
    rig.change(TRUE)
    await asyncio.sleep(60 * 5 + 1)
    beats = rig.api.written(NODE)
    gaps = [b.last_heartbeat_wall - a.last_heartbeat_wall for a, b in itertools.pairwise(beats)]
    assert len(beats) == 6  # the first write, then one a period
    assert all(60 <= gap <= 66 for gap in gaps), gaps
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_transition_time_moves_with_the_status_only() -> None:
    """A new reason with the same status is written but keeps lastTransitionTime; a new
    status moves it."""
    rig = Rig()
    rig.change(WRITE_FAILED)
    await settle()
    await asyncio.sleep(30)
    rig.change(RELEASE_FAILED)
    await settle()
    await asyncio.sleep(30)
    rig.change(TRUE)
    await settle()
    first, second, third = rig.api.written(NODE)
    assert second.reason == "ReleaseFailed"
    assert second.last_transition_wall == first.last_transition_wall
    assert second.last_heartbeat_wall == first.last_heartbeat_wall + 30
    assert third.last_transition_wall == first.last_transition_wall + 60
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_a_node_the_watch_shows_with_the_same_condition_is_not_rewritten() -> None:
    """A new leader learns from the node watch what each Node carries: the same status and
    reason is not rewritten (nor an Event posted), until its heartbeat is due."""
    rig = Rig(heartbeat_s=300.0)
    rig.writer.observed(NODE, rig.carried(WRITE_FAILED, heartbeat_age=100))
    rig.change(WRITE_FAILED, "a different message")
    await asyncio.sleep(150)
    assert rig.api.patches == []
    await asyncio.sleep(60)
    (beat,) = rig.api.written(NODE)
    assert beat.message == "a different message"
    assert beat.last_transition_wall == rig.carried(WRITE_FAILED).last_transition_wall - 210
    assert rig.events.events == []
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_what_the_watch_shows_decides_what_is_written() -> None:
    """A Node seen with another condition (or none: it was removed) is written again."""
    rig = Rig()
    rig.change(TRUE)
    await settle()
    rig.writer.observed(NODE, rig.carried(UNREACHABLE))
    await settle()
    rig.writer.observed(NODE, None)
    await settle()
    assert rig.keys() == [key(TRUE)] * 3
    # Seen elsewhere, unwatched nodes are only remembered.
    rig.writer.observed("gpu-2", rig.carried(TRUE))
    await settle()
    assert rig.keys("gpu-2") == []
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_a_failed_write_is_retried_with_exponential_backoff() -> None:
    """Each failed attempt waits a jittered delay in [c/2, c], c doubling from
    RETRY_INITIAL_S up to RETRY_MAX_S; success resets the backoff."""
    rig = Rig()
    rig.api.failures[NODE] = [ApiError("boom", status=500) for _ in range(9)]
    rig.change(WRITE_FAILED)
    await asyncio.sleep(400)
    times = [t for n, t, _ in rig.api.attempts if n == NODE]
    assert len(times) == 10
    assert rig.keys() == [key(WRITE_FAILED)]
    for attempt, (before, after) in enumerate(itertools.pairwise(times)):
        ceiling = min(RETRY_MAX_S, RETRY_INITIAL_S * 2**attempt)
        assert ceiling / 2 <= after - before <= ceiling, (attempt, after - before)
    assert rig.observer.count("failed") == 9
    assert rig.observer.count("ok") == 1

    rig.api.failures[NODE] = [ApiError("boom", status=500)]
    rig.change(TRUE)
    await asyncio.sleep(5)
    again = [t for n, t, _ in rig.api.attempts if n == NODE][-2:]
    assert RETRY_INITIAL_S / 2 <= again[1] - again[0] <= RETRY_INITIAL_S
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_retry_after_is_honoured() -> None:
    """A 429 with Retry-After: 7 is retried 7 s later, not at the shorter backoff."""
    rig = Rig()
    rig.api.failures[NODE] = [ApiError("slow down", status=429, retry_after=7.0)]
    rig.change(WRITE_FAILED)
    await asyncio.sleep(20)
    first, second = (t for n, t, _ in rig.api.attempts if n == NODE)
    assert second - first == pytest.approx(7.0)
    assert rig.keys() == [key(WRITE_FAILED)]
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_a_retry_writes_the_latest_state() -> None:
    """Changes while a retry is pending are not written separately: the retry writes the
    state the node is in by then."""
    rig = Rig()
    rig.api.failures[NODE] = [ApiError("boom", status=503, retry_after=5.0)]
    rig.change(WRITE_FAILED)
    await asyncio.sleep(1)
    rig.change(RELEASE_FAILED)
    rig.change(UNREACHABLE)
    await asyncio.sleep(10)
    assert len(rig.api.attempts) == 2
    assert rig.keys() == [key(UNREACHABLE)]
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_a_node_that_does_not_exist_is_dropped() -> None:
    """NotFound: no retry, no heartbeat, counted as not_found; a later change of the node
    (it is back) is written."""
    rig = Rig(heartbeat_s=60.0)
    rig.api.missing.add(NODE)
    rig.change(WRITE_FAILED)
    await asyncio.sleep(600)
    assert len(rig.api.attempts) == 1
    assert rig.observer.results == [("not_found", None)]
    rig.api.missing.clear()
    rig.change(TRUE)
    await settle()
    assert rig.keys() == [key(TRUE)]
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_a_removed_node_cancels_its_pending_retry() -> None:
    """node_removed: the pending retry is dropped and nothing more is written for it."""
    rig = Rig()
    rig.api.failures[NODE] = [ApiError("boom", status=500, retry_after=5.0)]
    rig.change(WRITE_FAILED)
    await settle()
    rig.writer.node_removed(NODE)
    await asyncio.sleep(600)
    assert len(rig.api.attempts) == 1
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_fenced_writes_are_held_and_written_on_resume() -> None:
    """With no write budget (not leading) nothing is written and each held write counts as
    fenced; resume() writes every held node, with its latest state."""
    rig = Rig()
    rig.fence.budget = 0.0
    rig.change(WRITE_FAILED)
    rig.change(TRUE, node="gpu-2")
    await asyncio.sleep(30)
    rig.change(UNREACHABLE)
    await settle()
    assert rig.api.attempts == []
    assert rig.observer.count("fenced") >= 2
    rig.fence.budget = 10.0
    rig.writer.resume()
    await settle()
    assert rig.keys() == [key(UNREACHABLE)]
    assert rig.keys("gpu-2") == [key(TRUE)]
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_resume_writes_a_due_heartbeat_held_by_the_fence() -> None:
    """A heartbeat that fell due while fenced is written on resume()."""
    rig = Rig(heartbeat_s=60.0)
    rig.change(TRUE)
    await settle()
    rig.fence.budget = 0.0
    await asyncio.sleep(200)
    assert len(rig.api.patches) == 1
    rig.fence.budget = 10.0
    rig.writer.resume()
    await settle()
    assert len(rig.api.patches) == 2
    await rig.writer.stop()


@pytest.mark.parametrize(
    ("budget", "deadline"), [(0.5, 0.5), (3.0, 3.0), (60.0, REQUEST_TIMEOUT_S)]
)
@pytest.mark.asyncio
async def test_a_write_never_outlives_the_fence(budget: float, deadline: float) -> None:
    """The request's deadline is what is left of the fence's budget, at most the request
    timeout; the Event that follows is bounded the same way."""
    rig = Rig()
    rig.fence.budget = budget
    rig.change(WRITE_FAILED)
    await settle()
    ((_, _, given),) = rig.api.attempts
    assert given == deadline
    assert rig.events.deadlines == [deadline]
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_a_node_queued_many_times_is_written_once_with_its_latest_state() -> None:
    """Changes that pile up before a worker gets to the node make one write, the last."""
    rig = Rig(start=False)
    for i in range(100):
        rig.change([WRITE_FAILED, RELEASE_FAILED, TRUE][i % 3], f"change {i}")
    rig.change(UNREACHABLE, "change 100")
    rig.writer.start()
    await settle()
    (written,) = rig.api.written(NODE)
    assert (written.key, written.message) == (key(UNREACHABLE), "change 100")
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_one_write_at_a_time_per_node() -> None:
    """Changes that arrive while a node's write is in flight do not start a second write
    for it beside the first; once it ends, the latest state is written after it."""
    rig = Rig(workers=4)
    gate = rig.api.gates[NODE] = asyncio.Event()
    rig.change(WRITE_FAILED, "first")
    await settle()
    rig.change(RELEASE_FAILED, "second")
    rig.change(UNREACHABLE, "third")
    await asyncio.sleep(1)
    assert rig.api.most_in_flight[NODE] == 1
    gate.set()
    await settle()
    assert [(c.key, c.message) for c in rig.api.written(NODE)] == [
        (key(WRITE_FAILED), "first"),
        (key(UNREACHABLE), "third"),
    ]
    last = rig.writer.written(NODE)
    assert last is not None
    assert last.message == "third"
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_many_nodes_are_written_concurrently_by_the_workers() -> None:
    """The workers write different nodes at the same time (one slow Node holds up one)."""
    rig = Rig(workers=4)
    rig.api.gates["slow"] = asyncio.Event()
    rig.change(WRITE_FAILED, node="slow")
    for i in range(10):
        rig.change(WRITE_FAILED, node=f"gpu-{i}")
    await settle()
    assert len(rig.api.patches) == 10
    rig.api.gates["slow"].set()
    await settle()
    assert len(rig.api.patches) == 11
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_detection_latency_runs_from_the_cycle_end_to_the_write() -> None:
    """A change caused by a cycle reports the time from that cycle's end to its write;
    a change not caused by a cycle, and a heartbeat, report none."""
    rig = Rig(heartbeat_s=60.0)
    rig.change(WRITE_FAILED, cycle_age=0.25)
    await settle()
    rig.change(UNREACHABLE)
    await settle()
    await asyncio.sleep(70)
    assert rig.observer.results == [("ok", 0.25), ("ok", None), ("ok", None)]
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_detection_latency_of_a_retried_write_counts_from_the_changing_cycle() -> None:
    """Cycles that confirm a condition still waiting to be written do not restart its
    detection latency: it is measured from the cycle that changed it."""
    rig = Rig()
    rig.api.failures[NODE] = [ApiError("boom", status=503, retry_after=20.0)]
    rig.change(WRITE_FAILED, "first", cycle_age=0.5)
    await asyncio.sleep(15)
    rig.change(WRITE_FAILED, "again", cycle_age=0.5)  # the next cycle, same failure
    await asyncio.sleep(10)
    assert rig.observer.results == [("failed", None), ("ok", pytest.approx(20.5))]
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_a_surprise_from_the_api_is_retried_and_the_workers_survive() -> None:
    """An exception that is not an ApiError is logged and retried like a failure; the
    worker goes on writing."""
    rig = Rig(workers=1)
    rig.api.failures[NODE] = [RuntimeError("bug")]
    rig.change(WRITE_FAILED)
    await asyncio.sleep(5)
    rig.change(TRUE, node="gpu-2")
    await settle()
    assert rig.keys() == [key(WRITE_FAILED)]
    assert rig.keys("gpu-2") == [key(TRUE)]
    assert all(not t.done() for t in rig.writer.tasks)
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_stop_waits_for_the_write_in_flight_and_starts_no_new_one() -> None:
    """stop() lets a write already sent finish (it is not cancelled: the request would go
    on without us, past the Lease's release) and then writes nothing more."""
    rig = Rig()
    gate = rig.api.gates[NODE] = asyncio.Event()
    rig.change(WRITE_FAILED)
    await settle()
    stopping = asyncio.create_task(rig.writer.stop())
    await asyncio.sleep(1)
    assert not stopping.done()
    gate.set()
    await stopping
    assert rig.api.cancelled == []
    assert rig.keys() == [key(WRITE_FAILED)]
    assert rig.writer.writes_in_flight == 0
    rig.change(TRUE)
    rig.change(TRUE, node="gpu-2")
    await asyncio.sleep(600)
    assert len(rig.api.attempts) == 1
    assert rig.writer.tasks == []


@pytest.mark.asyncio
async def test_stop_drops_pending_retries() -> None:
    """A retry pending at stop() never runs."""
    rig = Rig()
    rig.api.failures[NODE] = [ApiError("boom", status=500, retry_after=5.0)]
    rig.change(WRITE_FAILED)
    await settle()
    await rig.writer.stop()
    await asyncio.sleep(60)
    assert len(rig.api.attempts) == 1
