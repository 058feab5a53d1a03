"""A sequenced ring of ready-to-send messages, followed by any number of streams.

A publisher appends each message under its sequence number; every subscriber
keeps its own cursor and takes the messages after it at its own pace. What a
stream does per message is then what a bare broadcast does: wait, take the
shared message, send it. Publishing is O(1) in the ring and wakes every
waiting subscriber in one pass (a burst of publishes in one event-loop turn
wakes each of them once, since the first publish leaves none waiting). A
subscriber that falls further behind than the ring holds is told so
(:attr:`Signal.BEHIND`) instead of holding memory for it, and resyncs.

Each subscriber has a quiet period: :meth:`Subscription.next` returns
:attr:`Signal.QUIET` when nothing arrived for that long (a stream then sends a
heartbeat). One timer per subscriber follows its deadline lazily: it is not
re-armed per message, so a busy stream costs no timer work, and it fires at
most about once per quiet period.

Generic over the message type, and independent of what the messages are: the
node agent's Watch stream publishes its cycles here, a controller's cluster
stream can publish its node updates. Not thread-safe: publish, subscribe and
read on the one event loop that serves the streams.
"""

from __future__ import annotations

import asyncio
import time
from enum import Enum
from types import TracebackType
from typing import Generic, TypeVar

M = TypeVar("M")
# asyncio runs a timer up to one clock resolution early: that is on time.
_RESOLUTION = time.get_clock_info("monotonic").resolution


class Signal(str, Enum):
    """What :meth:`Subscription.next` returns when it has no message to give."""

    QUIET = "quiet"  # nothing new for the quiet period
    BEHIND = "behind"  # the next message has left the ring: resync, then move the cursor
    CLOSED = "closed"  # the broadcast ended


class Broadcast(Generic[M]):
    def __init__(self, *, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be positive")
        self._capacity = capacity
        # Message n lives at n % capacity while first <= n <= sequence.
        self._ring: list[M | None] = [None] * capacity
        self._first = 1
        self._sequence = 0
        self._waiters: dict[asyncio.Future[bool], None] = {}
        self._closed = False

    @property
    def sequence(self) -> int:
        """The latest message's sequence; 0 before any."""
        return self._sequence

    @property
    def first(self) -> int:
        """The oldest message still held (``sequence + 1`` while none is)."""
        return self._first

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def waiting(self) -> int:
        """Subscribers waiting for the next message."""
        return len(self._waiters)

    def publish(self, sequence: int, message: M) -> None:
        """Append ``message`` as number ``sequence`` and wake every waiting subscriber.

        Sequences increase. A jump (``sequence`` above the latest plus one)
        leaves a gap no subscriber can read across: those before it are
        behind.
        """
        if sequence <= self._sequence:
            raise ValueError(f"sequence {sequence} is not after {self._sequence}")
        if sequence != self._sequence + 1:
            self._first = sequence
        elif sequence - self._first >= self._capacity:
            self._first = sequence - self._capacity + 1
        self._ring[sequence % self._capacity] = message
        self._sequence = sequence
        self._wake()

    def get(self, sequence: int) -> M | None:
        """Message ``sequence`` if the ring holds it."""
        if self._first <= sequence <= self._sequence:
            return self._ring[sequence % self._capacity]
        return None

    def holds_after(self, position: int) -> bool:
        """Whether a subscriber at ``position`` can follow without a gap."""
        return position + 1 >= self._first

    def close(self) -> None:
        """End every subscription: :meth:`Subscription.next` returns ``CLOSED`` from now on."""
        self._closed = True
        self._wake()

    def nudge(self) -> None:
        """Wake every waiting subscriber as if its quiet period had passed (``QUIET``), so
        its stream looks again at what it serves (a node gone silent, say)."""
        waiters = self._waiters
        if waiters:
            self._waiters = {}
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(False)

    def subscribe(self, *, after: int, quiet_s: float | None) -> Subscription[M]:
        """A cursor at ``after`` (the last sequence the subscriber already has)."""
        return Subscription(self, after=after, quiet_s=quiet_s)

    def _wake(self) -> None:
        waiters = self._waiters
        if waiters:
            self._waiters = {}
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(True)


class Subscription(Generic[M]):
    """One subscriber's cursor on a :class:`Broadcast`; close it (or use ``with``) when done."""

    def __init__(self, broadcast: Broadcast[M], *, after: int, quiet_s: float | None) -> None:
        self.position = after  # the last sequence taken; the owner may move it (resync)
        self._broadcast = broadcast
        self._quiet_s = quiet_s
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[bool] | None = None
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None

    async def next(self) -> M | Signal:
        """The message after :attr:`position` (which advances), or why there is none."""
        broadcast = self._broadcast
        while True:
            if broadcast._closed:  # one mechanism, two classes
                return Signal.CLOSED
            wanted = self.position + 1
            if wanted <= broadcast._sequence:
                if wanted < broadcast._first:
                    return Signal.BEHIND
                self.position = wanted
                return broadcast._ring[wanted % broadcast._capacity]  # type: ignore[return-value]
            if not await self._wait():
                return Signal.QUIET

    async def _wait(self) -> bool:
        """Until a publish or close (True), or the quiet period passes (False)."""
        waiter: asyncio.Future[bool] = self._loop.create_future()
        waiters = self._broadcast._waiters
        waiters[waiter] = None
        if self._quiet_s is not None:
            self._deadline = self._loop.time() + self._quiet_s
            if self._timer is None:
                self._timer = self._loop.call_at(self._deadline, self._on_timer)
        self._waiter = waiter
        try:
            return await waiter
        finally:
            self._waiter = None
            # Still registered after a timeout or a cancellation (a publish empties
            # the table): without this, a quiet broadcast would collect dead waiters.
            waiters.pop(waiter, None)

    def _on_timer(self) -> None:
        now = self._loop.time()
        waiter = self._waiter
        if waiter is None:  # busy sending: the next wait arms the timer again
            self._timer = None
        elif self._deadline <= now + _RESOLUTION:
            self._timer = None
            if not waiter.done():
                waiter.set_result(False)
        else:  # waiting again since it was armed: follow the later deadline
            self._timer = self._loop.call_at(self._deadline, self._on_timer)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def __enter__(self) -> Subscription[M]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
