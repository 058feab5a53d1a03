"""The readiness rule and the hub that applies it."""

from __future__ import annotations

import asyncio

import pytest

from capwatch.agent.hub import Hub
from capwatch.agent.reports import CycleFailure, CycleFailureKind, CycleReport
from capwatch.kit.clock import FakeClock
from capwatch.kit.readiness import ReadinessReason, evaluate, stale_after


def report(seq: int, clock: FakeClock, *, ok: bool = True) -> CycleReport:
    failures = () if ok else (CycleFailure(kind=CycleFailureKind.DEVICE_COUNT_FAILED, message="x"),)
    now = clock.monotonic()
    return CycleReport(
        sequence=seq,
        started_wall=clock.wall(),
        finished_wall=clock.wall(),
        started_monotonic=now,
        finished_monotonic=now,
        failures=failures,
    )


@pytest.mark.parametrize(
    ("enforced", "age", "reason", "ready"),
    [
        (None, None, ReadinessReason.NO_CYCLE_YET, False),
        (False, 1.0, ReadinessReason.CYCLE_FAILED, False),
        (True, 0.0, ReadinessReason.READY, True),
        (True, 44.9, ReadinessReason.READY, True),
        (True, 45.0, ReadinessReason.STALE, False),
        (False, 100.0, ReadinessReason.STALE, False),  # hung after a failure: stale wins
    ],
)
def test_rule_table(enforced, age, reason, ready):
    """Ready iff the last cycle was enforced and is younger than the staleness bound."""
    result = evaluate(
        last_cycle_enforced=enforced,
        last_cycle_age_s=age,
        last_good_age_s=age,
        stale_after_s=stale_after(15),
    )
    assert result.reason is reason
    assert result.ready is ready


def test_healthy_cycle_longer_than_twice_the_interval_exposes_not_ready():
    """The loop sleeps after a cycle, so a cycle over 2x interval passes the 3x bound.

    Pinned so that a change of interval or bound cannot silently alter the budget.
    """
    interval = 15.0
    clock = FakeClock()
    hub = Hub(clock=clock, stale_after_s=stale_after(interval))
    hub.publish(report(1, clock))
    clock.advance(interval)  # the loop's sleep
    clock.advance(2 * interval + 0.1)  # the next (healthy, but long) cycle is still running
    assert hub.readiness().reason is ReadinessReason.STALE


def test_hub_readiness_tracks_cycles_and_ignores_wall_clock_steps():
    """Failed cycles drop readiness at once; stepping the wall clock changes nothing."""
    clock = FakeClock()
    hub = Hub(clock=clock, stale_after_s=45)
    assert hub.readiness().reason is ReadinessReason.NO_CYCLE_YET
    hub.publish(report(1, clock))
    assert hub.readiness().ready
    clock.step_wall(+3600)
    assert hub.readiness().ready
    clock.step_wall(-7200)
    assert hub.readiness().ready
    clock.advance(10)
    hub.publish(report(2, clock, ok=False))
    readiness = hub.readiness()
    assert readiness.reason is ReadinessReason.CYCLE_FAILED
    assert readiness.last_good_age_s == pytest.approx(10)
    assert "device_count_failed" in readiness.text


def test_ring_buffer_resume_and_resync():
    """since() returns the missed cycles while the ring holds them, None once they are gone."""
    clock = FakeClock()
    hub = Hub(clock=clock, stale_after_s=45, capacity=3)
    for seq in range(1, 6):
        hub.publish(report(seq, clock))
    assert [r.sequence for r in hub.since(3) or ()] == [4, 5]
    assert [r.sequence for r in hub.since(2) or ()] == [3, 4, 5]
    assert hub.since(1) is None
    assert hub.since(5) == ()


def test_history_gives_each_buffered_report_with_its_table_and_shows_a_gap():
    """history() pairs every report after a sequence with the device table right after it;
    where the ring lost some, it starts at the oldest it still holds."""
    clock = FakeClock()
    hub = Hub(clock=clock, stale_after_s=45, capacity=3)
    for seq in range(1, 6):
        hub.publish(report(seq, clock))
    assert hub.capacity == 3
    assert [(r.sequence, t is hub.devices_at(r.sequence)) for r, t in hub.history(3)] == [
        (4, True),
        (5, True),
    ]
    assert [r.sequence for r, _ in hub.history(4)] == [5]
    assert [r.sequence for r, _ in hub.history(0)] == [3, 4, 5]  # 1 and 2 are gone
    assert hub.history(5) == ()
    assert Hub(clock=clock, stale_after_s=45).history(0) == ()


def test_hub_readiness_can_be_asked_for_another_instant():
    """readiness(now=...) applies the rule as of that monotonic instant, not the clock's."""
    clock = FakeClock()
    hub = Hub(clock=clock, stale_after_s=45)
    hub.publish(report(1, clock))
    assert hub.readiness().ready
    later = hub.readiness(now=clock.monotonic() + 45)
    assert later.reason is ReadinessReason.STALE
    assert later.last_good_age_s == pytest.approx(45)
    assert hub.readiness().ready  # the clock itself has not moved


@pytest.mark.asyncio
async def test_async_waiters_are_woken_by_a_publish_from_another_thread():
    """Many asyncio readers, every one of them already blocked in wait(), wake on one
    publish made on a different thread; a reader of what is already there waits on."""
    clock = FakeClock()
    hub = Hub(clock=clock, stale_after_s=45)
    waiters = [asyncio.create_task(hub.wait(0, timeout=5)) for _ in range(200)]
    await asyncio.sleep(0)  # each task runs up to its await; none can finish without a publish
    assert not any(w.done() for w in waiters)
    await asyncio.to_thread(hub.publish, report(1, clock))
    assert all(await asyncio.gather(*waiters))
    assert not await hub.wait(1, timeout=0.05)


@pytest.mark.asyncio
async def test_a_burst_of_publishes_schedules_one_wake_up_per_loop():
    """Publishing faster than the loop runs costs it one wake-up, and no reader misses one."""
    clock = FakeClock()
    hub = Hub(clock=clock, stale_after_s=45)
    loop = asyncio.get_running_loop()
    scheduled = 0
    real = loop.call_soon_threadsafe

    def counting(*args: object) -> asyncio.Handle:
        nonlocal scheduled
        scheduled += 1
        return real(*args)  # type: ignore[arg-type]

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    try:
        waiter = asyncio.create_task(hub.wait(0, timeout=5))
        await asyncio.sleep(0)
        for seq in range(1, 51):  # no await between them: the loop cannot run the wake-up
            hub.publish(report(seq, clock))
        assert scheduled == 1
        assert await waiter
        # The wake-up ran, so the next publish schedules another, for a new reader.
        waiter = asyncio.create_task(hub.wait(50, timeout=5))
        await asyncio.sleep(0)
        hub.publish(report(51, clock))
        assert await waiter
        assert scheduled == 2
    finally:
        del loop.call_soon_threadsafe


@pytest.mark.asyncio
async def test_a_pending_wake_up_reaches_a_reader_that_replaced_the_event():
    """A wake-up scheduled before a reader started waiting on a fresh event still wakes it."""
    clock = FakeClock()
    hub = Hub(clock=clock, stale_after_s=45)
    first = asyncio.create_task(hub.wait(0, timeout=5))
    await asyncio.sleep(0)
    hub.publish(report(1, clock))
    assert await first  # the loop's event is now set
    # In this order on the loop: a reader up to date with 2 replaces the set event
    # and waits; 3 is published while the wake-up for 2 is still pending (so it
    # schedules none); that wake-up runs and must set the reader's new event.
    later = asyncio.create_task(hub.wait(2, timeout=2))
    asyncio.get_running_loop().call_soon(hub.publish, report(3, clock))
    hub.publish(report(2, clock))
    assert await later


@pytest.mark.parametrize(
    ("summary", "reason"),
    [
        ("state_unwritable", ReadinessReason.STATE_UNWRITABLE),
        ("state_unwritable,gpu1:write_failed", ReadinessReason.STATE_UNWRITABLE),
        ("gpu1:write_failed", ReadinessReason.CYCLE_FAILED),
        ("gpu1:state_unwritable_lookalike", ReadinessReason.CYCLE_FAILED),
    ],
)
def test_an_unsaved_record_has_its_own_reason(summary, reason):
    """A failed cycle whose failures include state_unwritable reads state-unwritable (with the
    whole summary as detail), from the summary alone, as the shim sees it; a stale one stays
    stale."""
    verdict = evaluate(
        last_cycle_enforced=False,
        last_cycle_age_s=1.0,
        last_good_age_s=None,
        stale_after_s=45.0,
        failure_summary=summary,
    )
    assert (verdict.reason, verdict.detail) == (reason, summary)
    stale = evaluate(
        last_cycle_enforced=False,
        last_cycle_age_s=50.0,
        last_good_age_s=None,
        stale_after_s=45.0,
        failure_summary=summary,
    )
    assert stale.reason is ReadinessReason.STALE
