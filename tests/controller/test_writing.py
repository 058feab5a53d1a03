"""The condition writer (controller/writes/writer.py): what is written to a Node and when --
only on a change of status or reason, a heartbeat, fenced by the lease, retried with
backoff, one write per node at a time with its latest state -- and what it reports.

Time is the virtual loop's: retries, Retry-After and heartbeats happen at exact instants."""

from __future__ import annotations

import asyncio
import itertools
import math

import pytest

from capwatch.controller.conditions import NodeCondition
from capwatch.controller.errors import ApiError
from capwatch.controller.writes.writer import RETRY_INITIAL_S, RETRY_MAX_S
from tests.controller.writing_rig import (
    NODE,
    RELEASE_FAILED,
    TRUE,
    UNREACHABLE,
    WRITE_FAILED,
    Rig,
    S,
    key,
    settle,
)


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
    """Each failed attempt waits the one backoff's delay: full jitter in [0, c], c
    doubling from RETRY_INITIAL_S up to RETRY_MAX_S; success resets the backoff."""
    rig = Rig()
    rig.api.failures[NODE] = [ApiError("boom", status=500) for _ in range(9)]
    rig.change(WRITE_FAILED)
    await asyncio.sleep(250)  # the 9 waits take at most 183.5 s; a heartbeat comes at 300 s
    times = [t for n, t, _ in rig.api.attempts if n == NODE]
    assert len(times) == 10
    assert rig.keys() == [key(WRITE_FAILED)]
    for attempt, (before, after) in enumerate(itertools.pairwise(times)):
        ceiling = min(RETRY_MAX_S, RETRY_INITIAL_S * 2**attempt)
        assert 0 <= after - before <= ceiling, (attempt, after - before)
    assert rig.observer.count("failed") == 9
    assert rig.observer.count("ok") == 1

    rig.api.failures[NODE] = [ApiError("boom", status=500)]
    rig.change(TRUE)
    await asyncio.sleep(5)
    again = [t for n, t, _ in rig.api.attempts if n == NODE][-2:]
    assert 0 <= again[1] - again[0] <= RETRY_INITIAL_S
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_a_node_refused_five_thousand_times_keeps_retrying_and_the_writer_lives() -> None:
    """A persistent refusal (a 403 until RBAC is fixed), 5,000 times in a row on virtual
    time: retries never stop and never come more than RETRY_MAX_S apart (no overflow
    past attempt 1,024, no dead worker), other nodes are written meanwhile, and the
    first write after the refusals end lands."""
    rig = Rig()
    rig.api.failures[NODE] = [ApiError("forbidden", status=403) for _ in range(5_000)]
    rig.change(WRITE_FAILED)

    def tries() -> list[float]:
        return [t for n, t, _ in rig.api.attempts if n == NODE]

    for _ in range(6_000):  # bounded: 5,001 tries at most RETRY_MAX_S apart
        if len(tries()) > 5_000:
            break
        await asyncio.sleep(RETRY_MAX_S)
        if len(tries()) == 2_500:
            rig.change(TRUE, node="gpu-2")
    times = tries()
    assert len(times) == 5_001
    assert max(b - a for a, b in itertools.pairwise(times)) <= RETRY_MAX_S
    assert rig.keys() == [key(WRITE_FAILED)]
    assert set(rig.keys("gpu-2")) == {key(TRUE)}  # written, then heartbeats
    assert all(not task.done() for task in rig.writer.tasks)
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
async def test_a_retry_writes_the_latest_message() -> None:
    """A message-only change while a retry is pending is not written separately (nor is
    the same status and reason again): the retry writes the message the node has by then."""
    rig = Rig()
    rig.api.failures[NODE] = [ApiError("boom", status=503, retry_after=5.0)]
    rig.change(WRITE_FAILED, "gpu1 failed")
    await asyncio.sleep(1)
    rig.change(WRITE_FAILED, "gpu1 and gpu2 failed")
    await asyncio.sleep(10)
    assert [at for _, at, _ in rig.api.attempts] == [1000.0, 1005.0]
    assert [c.message for c in rig.api.written(NODE)] == ["gpu1 and gpu2 failed"]
    await rig.writer.stop()


@pytest.mark.parametrize("retry_after", [3600.0, math.inf])
@pytest.mark.asyncio
async def test_a_huge_retry_after_waits_no_longer_than_the_backoff_ceiling(
    retry_after: float,
) -> None:
    """Retry-After: 3600 (or infinity) is capped at the backoff's ceiling: the node is tried
    again RETRY_MAX_S later, not in an hour (or never)."""
    rig = Rig()
    rig.api.failures[NODE] = [ApiError("slow down", status=429, retry_after=retry_after)]
    rig.change(WRITE_FAILED)
    await asyncio.sleep(2 * RETRY_MAX_S)
    first, second = (t for n, t, _ in rig.api.attempts if n == NODE)
    assert second - first == pytest.approx(RETRY_MAX_S)
    assert rig.keys() == [key(WRITE_FAILED)]
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_a_pending_retry_never_delays_a_newer_state() -> None:
    """A node True, then failing, its write refused (503) with Retry-After: 3600: when
    its state changes again (Unknown) during the retry's wait, the new state is written at
    once, not when the retry is due; its backoff carries on (a second refusal waits
    longer), and the retry it replaced writes nothing more."""
    rig = Rig()
    rig.api.failures[NODE] = [
        ApiError("unavailable", status=503, retry_after=3600.0),
        ApiError("unavailable", status=503, retry_after=3600.0),
    ]
    rig.change(WRITE_FAILED)
    await asyncio.sleep(5)
    rig.change(UNREACHABLE)
    await settle()
    assert [at for _, at, _ in rig.api.attempts] == [1000.0, 1005.0]
    assert rig.writer._queue.failures(NODE) == 2
    rig.change(TRUE)
    await settle()
    assert [at for _, at, _ in rig.api.attempts] == [1000.0, 1005.0, 1005.0]
    assert rig.keys() == [key(TRUE)]
    assert rig.writer._queue.failures(NODE) == 0
    await asyncio.sleep(2 * RETRY_MAX_S)
    assert len(rig.api.attempts) == 3
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
async def test_news_is_written_ahead_of_a_backlog_of_first_reports() -> None:
    """A first install queues thousands of first reports of True at once; a node that
    fails meanwhile, one first reported Unknown, and one recovering from a False the Node
    carries are all written before the backlog, which then drains in its own order."""
    rig = Rig(workers=1)
    rig.api.gates["first-0"] = gate = asyncio.Event()  # holds the one worker
    for i in range(100):
        rig.change(TRUE, node=f"first-{i}")
    await settle()
    rig.writer.observed("recovering", rig.carried(WRITE_FAILED))
    rig.change(WRITE_FAILED, node="failing")
    rig.change(UNREACHABLE, node="unreachable")
    rig.change(TRUE, node="recovering")
    gate.set()
    for _ in range(20):
        await settle()
    order = [patch.node for patch in rig.api.patches]
    assert order[:4] == ["first-0", "failing", "unreachable", "recovering"]
    assert order[4:] == [f"first-{i}" for i in range(1, 100)]
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_a_queued_first_report_that_fails_moves_ahead() -> None:
    """A node waiting in the backlog with its first report of True that turns False before
    its turn is written at the news' priority, with the False."""
    rig = Rig(workers=1)
    rig.api.gates["first-0"] = gate = asyncio.Event()
    for i in range(50):
        rig.change(TRUE, node=f"first-{i}")
    await settle()
    rig.change(WRITE_FAILED, node="first-40")
    gate.set()
    for _ in range(20):
        await settle()
    order = [patch.node for patch in rig.api.patches]
    assert order[:2] == ["first-0", "first-40"]
    assert rig.keys("first-40") == [key(WRITE_FAILED)]
    assert len(order) == 50
    await rig.writer.stop()
