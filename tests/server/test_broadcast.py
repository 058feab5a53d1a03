"""The shared broadcast (kit/broadcast.py): cursors, wake-ups, resync, quiet periods."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from capwatch.kit.broadcast import Broadcast, Signal

pytestmark = pytest.mark.asyncio

QUIET = 60.0  # no quiet period ends within a test unless it asks for one


async def take(subscription: Any, count: int) -> list[Any]:
    async with asyncio.timeout(2):
        return [await subscription.next() for _ in range(count)]


async def test_each_subscriber_takes_every_message_after_its_cursor_in_order() -> None:
    """Subscribers at different cursors each get exactly the messages after theirs."""
    broadcast: Broadcast[str] = Broadcast(capacity=8)
    for n in range(1, 4):
        broadcast.publish(n, f"m{n}")
    with (
        broadcast.subscribe(after=0, quiet_s=QUIET) as early,
        broadcast.subscribe(after=2, quiet_s=QUIET) as late,
    ):
        assert await take(early, 3) == ["m1", "m2", "m3"]
        assert await take(late, 1) == ["m3"]
        waiting = asyncio.create_task(late.next())
        await asyncio.sleep(0)
        broadcast.publish(4, "m4")
        assert await waiting == "m4"
        assert await take(early, 1) == ["m4"]
        assert (early.position, late.position) == (4, 4)


async def test_a_publish_wakes_every_waiting_subscriber_and_a_burst_loses_nothing() -> None:
    """200 waiting subscribers wake on one publish; a burst before they run reaches each whole."""
    broadcast: Broadcast[int] = Broadcast(capacity=64)
    subscriptions = [broadcast.subscribe(after=0, quiet_s=QUIET) for _ in range(200)]

    async def read(subscription: Any) -> list[Any]:
        return await take(subscription, 10)

    readers = [asyncio.create_task(read(s)) for s in subscriptions]
    await asyncio.sleep(0)
    assert broadcast.waiting == 200
    for n in range(1, 11):  # no await between them: nobody runs in between
        broadcast.publish(n, n)
    assert broadcast.waiting == 0  # woken once, by the first
    assert await asyncio.gather(*readers) == [list(range(1, 11))] * 200
    for subscription in subscriptions:
        subscription.close()


async def test_a_subscriber_behind_the_ring_is_told_and_resumes_where_it_is_put() -> None:
    """Overwritten messages are not replayed: BEHIND, then the owner moves the cursor."""
    broadcast: Broadcast[int] = Broadcast(capacity=4)
    with broadcast.subscribe(after=0, quiet_s=QUIET) as slow:
        for n in range(1, 11):
            broadcast.publish(n, n)
        assert (broadcast.first, broadcast.sequence) == (7, 10)
        assert not broadcast.holds_after(5)
        assert broadcast.holds_after(6)
        assert await slow.next() is Signal.BEHIND
        assert slow.position == 0  # unchanged: the owner decides where to resume
        slow.position = 8
        assert await take(slow, 2) == [9, 10]
        assert broadcast.get(6) is None
        assert broadcast.get(7) == 7


async def test_a_jump_in_sequences_is_a_gap_nobody_reads_across() -> None:
    """Publishing 10 after 3: a subscriber at 2 is behind, one at 3 or later is not."""
    broadcast: Broadcast[int] = Broadcast(capacity=8)
    for n in (1, 2, 3, 10):
        broadcast.publish(n, n)
    assert broadcast.first == 10
    with (
        broadcast.subscribe(after=2, quiet_s=QUIET) as before,
        broadcast.subscribe(after=9, quiet_s=QUIET) as after,
    ):
        assert await before.next() is Signal.BEHIND
        assert await take(after, 1) == [10]
    with pytest.raises(ValueError, match="not after"):
        broadcast.publish(10, 10)


async def test_a_quiet_period_without_messages_returns_quiet_then_messages_flow_again() -> None:
    """Nothing for the quiet period: QUIET. Later messages still arrive, in order."""
    broadcast: Broadcast[int] = Broadcast(capacity=8)
    with broadcast.subscribe(after=0, quiet_s=0.05) as subscription:
        async with asyncio.timeout(2):
            assert await subscription.next() is Signal.QUIET
            assert await subscription.next() is Signal.QUIET
        # Waits that timed out leave nothing behind (a quiet broadcast would collect them).
        assert broadcast.waiting == 0
        broadcast.publish(1, 1)
        assert await take(subscription, 1) == [1]


async def test_a_busy_subscriber_arms_no_timer_per_message() -> None:
    """One timer follows the quiet deadline lazily: 500 wake-ups schedule at most a couple."""
    loop = asyncio.get_running_loop()
    armed = 0
    real = loop.call_at

    def counting(*args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        nonlocal armed
        armed += 1
        return real(*args, **kwargs)

    broadcast: Broadcast[int] = Broadcast(capacity=8)
    loop.call_at = counting  # type: ignore[method-assign]
    try:
        with broadcast.subscribe(after=0, quiet_s=QUIET) as subscription:
            for n in range(1, 501):
                waiting = asyncio.create_task(subscription.next())
                await asyncio.sleep(0)
                broadcast.publish(n, n)
                assert await waiting == n
            assert armed == 1
    finally:
        del loop.call_at


async def test_close_ends_waiting_and_later_reads() -> None:
    """close(): a waiting subscriber gets CLOSED at once, and so does every later read."""
    broadcast: Broadcast[int] = Broadcast(capacity=8)
    broadcast.publish(1, 1)
    with broadcast.subscribe(after=1, quiet_s=QUIET) as subscription:
        waiting = asyncio.create_task(subscription.next())
        await asyncio.sleep(0)
        broadcast.close()
        assert await waiting is Signal.CLOSED
        assert broadcast.closed
    with broadcast.subscribe(after=0, quiet_s=QUIET) as late:
        assert await late.next() is Signal.CLOSED  # even with a message it has not taken


async def test_a_cancelled_subscriber_leaves_no_waiter_behind() -> None:
    """A stream cancelled while it waits (its client went away) is forgotten at once."""
    broadcast: Broadcast[int] = Broadcast(capacity=8)
    with broadcast.subscribe(after=0, quiet_s=QUIET) as subscription:
        waiting = asyncio.create_task(subscription.next())
        await asyncio.sleep(0)
        assert broadcast.waiting == 1
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert broadcast.waiting == 0


async def test_capacity_must_be_positive() -> None:
    """A ring that holds nothing is a configuration mistake, refused up front."""
    with pytest.raises(ValueError, match="positive"):
        Broadcast(capacity=0)
