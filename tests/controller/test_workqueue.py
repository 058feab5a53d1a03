"""The controller's work queue (controller/writes/workqueue.py): client-go's rules, on
virtual time, by example and by property."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capwatch.controller.writes.workqueue import ItemBackoff, WorkQueue
from capwatch.kit.backoff import Backoff
from tests.controller.virtual_time import VirtualTimeLoop

BACKOFF = Backoff(initial_s=0.5, max_s=60.0)


def run(body: Callable[[], Awaitable[Any]]) -> Any:
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(body())
    finally:
        loop.close()


def queue(seed: int = 1) -> WorkQueue[str]:
    return WorkQueue(rate_limiter=ItemBackoff(BACKOFF, rng=random.Random(seed)))


async def drain(q: WorkQueue[str]) -> set[str]:
    """Every key the queue hands out now, each marked done; none may come twice."""
    drained: set[str] = set()
    while True:
        try:
            key = await take(q)
        except TimeoutError:
            return drained
        assert key is not None
        assert key not in drained
        drained.add(key)
        q.done(key)


async def take(q: WorkQueue[str]) -> str | None:
    """A get that must not block: the key is there (or the queue is shutting down)."""
    return await asyncio.wait_for(q.get(), timeout=0.001)


def test_a_key_added_twice_is_handed_out_once() -> None:
    """Dirty set: adding a queued key again queues nothing more."""

    async def body() -> None:
        q = queue()
        q.add("a")
        q.add("a")
        q.add("b")
        assert len(q) == 2
        assert [await take(q), await take(q)] == ["a", "b"]
        assert len(q) == 0

    run(body)


def test_a_key_added_while_processing_comes_back_only_after_done() -> None:
    """Processing set: a key is never handed out beside itself; added meanwhile, it is
    queued again when done() is called, once."""

    async def body() -> None:
        q = queue()
        q.add("a")
        assert await take(q) == "a"
        q.add("a")
        q.add("a")
        assert len(q) == 0  # dirty, queued again only at done()
        with pytest.raises(TimeoutError):
            await take(q)
        q.done("a")
        assert await take(q) == "a"
        q.done("a")
        with pytest.raises(TimeoutError):
            await take(q)

    run(body)


def test_a_higher_priority_goes_first_and_overtakes_the_same_key() -> None:
    """Lower priority numbers first, then in the order added; re-adding a key at a higher
    priority moves it up and it is still handed out once."""

    async def body() -> None:
        q = queue()
        q.add("hb-1", priority=1)
        q.add("hb-2", priority=1)
        q.add("change", priority=0)
        q.add("hb-2", priority=0)
        q.add("hb-2", priority=1)  # a lower priority does not move it back
        got = [await take(q) for _ in range(3)]
        assert got == ["change", "hb-2", "hb-1"]
        with pytest.raises(TimeoutError):
            await take(q)

    run(body)


def test_add_after_waits_and_the_earliest_request_wins() -> None:
    """add_after queues the key once its delay has passed; a later request for the same
    key does not push it back, an earlier one brings it forward."""

    async def body() -> None:
        q = queue()
        loop = asyncio.get_running_loop()
        start = loop.time()
        q.add_after("a", 10)
        q.add_after("a", 20)
        assert q.waiting("a")
        assert await q.get() == "a"
        assert loop.time() - start == pytest.approx(10)
        q.done("a")
        q.add_after("b", 30)
        q.add_after("b", 5)
        assert await q.get() == "b"
        assert loop.time() - start == pytest.approx(15)

    run(body)


def test_rate_limited_adds_back_off_exponentially_with_full_jitter_and_forget_resets() -> None:
    """The n-th failure in a row waits uniformly in [0, min(max, initial * 2**n)];
    forget() starts the next failure from the first delay again."""

    async def body() -> None:
        q = queue(seed=7)
        loop = asyncio.get_running_loop()
        for attempt in range(12):
            before = loop.time()
            delay = q.add_rate_limited("a")
            assert 0 <= delay <= min(BACKOFF.max_s, BACKOFF.initial_s * 2**attempt)
            assert await q.get() == "a"
            assert loop.time() - before == pytest.approx(delay)
            q.done("a")
        assert q.failures("a") == 12
        q.forget("a")
        assert q.failures("a") == 0
        assert q.add_rate_limited("a") <= BACKOFF.initial_s

    run(body)


def test_retry_after_is_a_floor_on_the_rate_limited_delay() -> None:
    """A server's Retry-After is waited out even when the backoff says less."""

    async def body() -> None:
        q = queue()
        assert q.add_rate_limited("a", floor_s=7.0) == 7.0

    run(body)


def test_a_retried_key_comes_back_at_the_place_it_was_handed_out_from() -> None:
    """A key that failed and waits its backoff is queued, when due, at the priority and
    order it was handed out with: ahead of keys added after it at that priority (client-go
    would put it last), behind those added before it, and so is new work for that key
    added while its retry waits."""

    async def body() -> None:
        q = queue(seed=3)
        q.add("early", priority=1)
        q.add("a", priority=1)
        assert await take(q) == "early"
        assert await take(q) == "a"
        for key in ("b", "c"):
            q.add(key, priority=1)
        q.add_rate_limited("a")
        q.done("a")
        q.done("early")
        q.add("early", priority=1)  # fresh work, after "a" failed: it goes last
        await asyncio.sleep(BACKOFF.initial_s)  # the retry is due
        assert [await take(q) for _ in range(4)] == ["a", "b", "c", "early"]

        for key in ("a", "b", "c", "early"):
            q.done(key)
        q.add("x", priority=1)
        assert await take(q) == "x"
        q.add_rate_limited("x")
        q.done("x")
        q.add("y", priority=1)
        q.cancel_wait("x")
        q.add("x", priority=1)  # newer work for x while its retry waited
        assert [await take(q), await take(q)] == ["x", "y"]

    run(body)


def test_requeue_puts_a_key_back_at_its_place_at_once() -> None:
    """requeue(): no backoff, the key's place kept (a try the server turned away whole)."""

    async def body() -> None:
        q = queue()
        q.add("a", priority=2)
        assert await take(q) == "a"
        q.add("b", priority=2)
        q.requeue("a")
        q.done("a")
        assert q.failures("a") == 0
        assert [await take(q), await take(q)] == ["a", "b"]

    run(body)


def test_a_pause_hands_out_nothing_until_it_ends_and_shut_down_ends_it() -> None:
    """pause(5): get() waits the 5 s even with keys queued, then hands them out in order;
    a shorter pause does not shorten it; a shut-down during a pause releases getters."""

    async def body() -> None:
        q = queue()
        loop = asyncio.get_running_loop()
        q.add("a")
        q.add("b")
        start = loop.time()
        q.pause(5.0)
        q.pause(1.0)
        assert q.paused()
        assert await q.get() == "a"
        assert loop.time() - start == pytest.approx(5.0)
        assert await take(q) == "b"
        q.pause(30.0)
        q.add("c")
        waiting = asyncio.create_task(q.get())
        await asyncio.sleep(1)
        assert not waiting.done()
        q.shut_down()
        assert await waiting is None

    run(body)


def test_five_thousand_refusals_keep_retrying_at_the_ceiling() -> None:
    """A key that fails for ever (a persistent 403) retries for ever, never faster than
    the jitter allows and never slower than the ceiling; nothing overflows."""

    async def body() -> None:
        q = queue(seed=3)
        loop = asyncio.get_running_loop()
        tries = 0
        start = loop.time()
        q.add("node")
        while tries < 5_000:
            key = await q.get()
            assert key == "node"
            tries += 1
            q.add_rate_limited("node")
            q.done("node")
        elapsed = loop.time() - start
        # The mean of full jitter under the ceiling is half of it.
        assert 0.4 * BACKOFF.max_s * 4_990 < elapsed < 0.6 * BACKOFF.max_s * 5_000
        assert q.failures("node") == 5_000

    run(body)


def test_shut_down_with_drain_waits_for_keys_in_flight_and_drops_the_rest() -> None:
    """After shut-down get() returns None, adds are ignored, queued and waiting keys are
    dropped (a key added while processing is not queued again at done()), and the drain
    returns only once every key handed out is done."""

    async def body() -> None:
        q = queue()
        q.add("a")
        q.add("b")
        assert await take(q) == "a"
        q.add("a")
        q.add_after("c", 5)
        drained = asyncio.create_task(q.shut_down_with_drain())
        await asyncio.sleep(0)
        assert not drained.done()
        assert len(q) == 0
        assert not q.waiting("c")
        assert await q.get() is None
        q.add("d")
        q.done("a")
        await drained
        assert await q.get() is None
        assert len(q) == 0

    run(body)


def test_a_getter_waiting_at_shut_down_gets_none() -> None:
    """Workers blocked in get() when the queue shuts down are released with None."""

    async def body() -> None:
        q = queue()
        waiting = [asyncio.create_task(q.get()) for _ in range(3)]
        await asyncio.sleep(0)
        q.shut_down()
        assert await asyncio.gather(*waiting) == [None, None, None]

    run(body)


def test_a_getter_cancelled_after_its_wake_up_passes_the_key_on() -> None:
    """Two workers wait; the one woken for a key is cancelled before it runs: the other
    worker gets the key, so no key is stranded in the queue."""

    async def body() -> None:
        q = queue()
        first = asyncio.create_task(q.get())
        second = asyncio.create_task(q.get())
        await asyncio.sleep(0)
        q.add("a")
        first.cancel()
        assert await second == "a"
        with pytest.raises(asyncio.CancelledError):
            await first

    run(body)


KEYS = st.sampled_from(["a", "b", "c", "d"])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), KEYS, st.integers(0, 1)),
        st.tuples(st.just("add_after"), KEYS, st.floats(0, 100)),
        st.tuples(st.just("get")),
        st.tuples(st.just("done")),
        st.tuples(st.just("sleep"), st.floats(0, 50)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=OPS)
def test_property_no_key_is_lost_or_handed_out_beside_itself(ops: list[tuple[Any, ...]]) -> None:
    """Any sequence of adds, delayed adds, gets, dones and waits: a key is never handed
    out while it is processing nor unless it was added since it last was, a get finds
    a key whenever one is due, and once everything is done and every delay has passed,
    each key added since its last hand-out is handed out once more (nothing is lost)."""

    async def body() -> None:
        q = queue()
        processing: list[str] = []
        owed: dict[str, int] = {}  # key -> its best priority since it was last handed out
        # Keys with a delayed add: its timer may fire before or after a hand-out of the key,
        # so such a key may come once more than the model can tell.
        delayed: set[str] = set()
        for op in ops:
            if op[0] == "add":
                q.add(op[1], priority=op[2])
                owed[op[1]] = min(owed.get(op[1], op[2]), op[2])
            elif op[0] == "add_after":
                q.add_after(op[1], op[2])
                owed.setdefault(op[1], 0)
                delayed.add(op[1])
            elif op[0] == "get":
                ready = {k: p for k, p in owed.items() if k not in processing and not q.waiting(k)}
                try:
                    key = await take(q)
                except TimeoutError:
                    assert not ready
                    continue
                assert key is not None
                assert key not in processing
                assert key in owed or key in delayed
                processing.append(key)
                owed.pop(key, None)
                if q.waiting(key):
                    owed[key] = 0  # a delayed add of it is still to come
            elif op[0] == "done" and processing:
                q.done(processing.pop(0))
            elif op[0] == "sleep":
                await asyncio.sleep(op[1])
        for key in processing:
            q.done(key)
        await asyncio.sleep(200)  # every add_after is due
        drained = await drain(q)
        assert set(owed) <= drained <= set(owed) | delayed

    run(body)


RETRY_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), KEYS, st.integers(0, 2)),
        st.tuples(st.just("get")),
        st.tuples(st.just("fail")),  # the oldest key processing: add_rate_limited, done
        st.tuples(st.just("throttle"), st.floats(0.1, 30)),  # pause, requeue, done
        st.tuples(st.just("succeed")),  # the oldest key processing: forget, done
        st.tuples(st.just("sleep"), st.floats(0, 70)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=RETRY_OPS)
def test_property_retries_pauses_and_requeues_lose_no_key(ops: list[tuple[Any, ...]]) -> None:
    """Any sequence of adds, hand-outs, failures (retried after a backoff), throttles
    (a pause, the key requeued) and successes: a key is never handed out beside itself,
    no get hands out a key during a pause, and once everything is done and every
    backoff and pause has passed, every key that failed or was throttled or added since
    its last hand-out is handed out once more (a retry keeps its place but is never
    lost), and the queue keeps no retry place for a key that is neither queued, waiting
    nor processing."""

    async def body() -> None:
        q = queue(seed=5)
        processing: list[str] = []
        owed: set[str] = set()
        for op in ops:
            if op[0] == "add":
                q.add(op[1], priority=op[2])
                owed.add(op[1])
            elif op[0] == "get":
                try:
                    key = await take(q)
                except TimeoutError:
                    continue
                assert key is not None
                assert not q.paused()
                assert key not in processing
                processing.append(key)
                owed.discard(key)
            elif op[0] in ("fail", "throttle", "succeed") and processing:
                key = processing.pop(0)
                if op[0] == "fail":
                    q.add_rate_limited(key)
                    owed.add(key)
                elif op[0] == "throttle":
                    q.pause(op[1])
                    q.requeue(key)
                    owed.add(key)
                else:
                    q.forget(key)
                q.done(key)
            elif op[0] == "sleep":
                await asyncio.sleep(op[1])
        for key in processing:
            q.done(key)
        await asyncio.sleep(200)  # every backoff (60 s at most) and pause (30 s) is over
        assert not q.paused()
        drained = await drain(q)
        assert owed <= drained
        assert len(q) == 0
        assert q._kept == {}

    run(body)
