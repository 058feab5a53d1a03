"""The condition writer (controller/writes/writer.py) under its lease and its workers: fenced
writes held and resumed, a write's deadline bounded by the fence, one write per node at a
time, concurrency across nodes, detection latency, surprises from the API, and stop.

Time is the virtual loop's: retries, Retry-After and heartbeats happen at exact instants."""

from __future__ import annotations

import asyncio

import pytest

from capwatch.controller.errors import ApiError, DeadlinePassed, FencedOut
from capwatch.kube.wire import WRITE_TIMEOUT_S
from tests.controller.writing_rig import (
    NODE,
    RELEASE_FAILED,
    TRUE,
    UNREACHABLE,
    WRITE_FAILED,
    Rig,
    key,
    settle,
)


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


@pytest.mark.parametrize(("budget", "deadline"), [(0.5, 0.5), (3.0, 3.0), (60.0, WRITE_TIMEOUT_S)])
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


@pytest.mark.asyncio
async def test_a_write_the_fencing_policy_refuses_is_a_lost_lease_not_a_retry() -> None:
    """A 403 from the API server's fencing policy stops the writer as a lost lease does:
    the fence is told (it steps down), the node is held, not retried on a backoff, and
    it is written once the replica leads again (resume)."""
    rig = Rig()
    rig.api.failures[NODE] = [FencedOut("capwatch fencing: not the holder", status=403)]
    rig.change(WRITE_FAILED)
    await settle()
    assert rig.fence.losses == ["capwatch fencing: not the holder"]
    assert rig.observer.count("refused") == 1
    await asyncio.sleep(300)  # no retry while not leading
    assert len(rig.api.attempts) == 1
    rig.fence.budget = 10.0
    rig.writer.resume()
    await settle()
    assert rig.keys() == [key(WRITE_FAILED)]
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_an_event_the_fencing_policy_refuses_closes_the_fence() -> None:
    """An Event refused by the fencing policy is counted as refused and tells the fence;
    the condition written before it stays written."""
    rig = Rig()
    rig.events.failures = [FencedOut("capwatch fencing: not the holder", status=403)]
    rig.change(WRITE_FAILED)
    await settle()
    assert rig.keys() == [key(WRITE_FAILED)]
    assert rig.events.said() == []
    assert rig.fence.losses == ["capwatch fencing: not the holder"]
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_a_write_not_sent_past_its_deadline_is_read_against_the_fence_again() -> None:
    """A write the API client dropped because its deadline had passed (DeadlinePassed) is
    no failure to back off from: counted expired, it is tried again at once while the fence
    is open (the elector renewed meanwhile), with no backoff recorded for the node."""
    rig = Rig()
    rig.api.failures[NODE] = [DeadlinePassed("PATCH: not sent")]
    rig.change(WRITE_FAILED)
    await settle()
    assert [at for _, at, _ in rig.api.attempts] == [1000.0, 1000.0]
    assert rig.keys() == [key(WRITE_FAILED)]
    assert rig.observer.count("expired") == 1
    assert rig.observer.count("failed") == 0
    assert rig.writer._queue.failures(NODE) == 0
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_a_write_not_sent_past_its_deadline_is_held_while_the_fence_is_closed() -> None:
    """Dropped past its deadline with the fence closed since (the process was paused past
    its renew deadline): not retried as the holder, held, and written once the replica
    leads again (resume())."""
    rig = Rig()
    rig.api.failures[NODE] = [DeadlinePassed("PATCH: not sent")]
    gate = rig.api.gates[NODE] = asyncio.Event()
    rig.change(WRITE_FAILED)
    await settle()  # handed to the API, waiting for its thread
    rig.fence.budget = 0.0
    del rig.api.gates[NODE]
    gate.set()
    await asyncio.sleep(120)  # far past any backoff: nothing is retried
    assert len(rig.api.attempts) == 1
    assert rig.observer.count("expired") == 1
    assert rig.observer.count("fenced") == 1
    rig.fence.budget = 10.0
    rig.writer.resume()
    await settle()
    assert rig.keys() == [key(WRITE_FAILED)]
    await rig.writer.stop()
