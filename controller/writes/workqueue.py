"""A work queue in client-go's shape, for asyncio: each key queued once, processed alone.

The rules (client-go's ``util/workqueue``):

- **dirty**: a key added while it is queued is not queued twice; it is handed
  out once, and whoever takes it reads the latest state then;
- **processing**: a key handed out by :meth:`WorkQueue.get` is not handed out
  again until :meth:`WorkQueue.done`; added meanwhile, it is queued again at
  ``done``, so one key is never worked on beside itself;
- **add after**: :meth:`WorkQueue.add_after` queues a key once a delay has
  passed (the earliest of several such requests wins);
- **rate limiting**: :meth:`WorkQueue.add_rate_limited` waits the key's own
  backoff (:class:`ItemBackoff`: exponential, full jitter, a ceiling), which
  :meth:`WorkQueue.forget` resets after a success;
- **pause**: :meth:`WorkQueue.pause` hands out nothing until a delay has
  passed (the server said "too many requests": it is the server that is
  busy, not one key);
- **shut down**: :meth:`WorkQueue.shut_down_with_drain` takes no new key and
  waits until every key handed out is done.

Three things differ from client-go, all for the condition writer. Keys carry
a priority (lower first, then in the order added): a change of a Node's
condition goes ahead of every heartbeat waiting. A key retried keeps its
place: when its backoff ends it is queued with the priority and the order it
was first handed out with, ahead of whatever was added since (and so is new
work for that key while its retry waits), so a run of failures never sends
the failing keys behind fresh work, and under a server that keeps refusing
the keys are served in the order they came. And a shut-down drops what is
still queued rather than handing it out: a write not begun must not begin
once the writer stops, since the Lease is released after it.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import random
from collections.abc import Hashable
from typing import Generic, TypeVar

from capwatch.kit.backoff import Backoff

K = TypeVar("K", bound=Hashable)


class ItemBackoff(Generic[K]):
    """Per-key exponential backoff: the n-th failure in a row of a key waits
    ``Backoff.delay(n)`` (full jitter under a ceiling that cannot overflow)."""

    def __init__(self, backoff: Backoff, *, rng: random.Random | None = None) -> None:
        self._backoff = backoff
        self._rng = rng or random.Random()
        self._failures: dict[K, int] = {}

    def when(self, key: K, *, floor_s: float | None = None) -> float:
        """The delay before ``key``'s next try, counting this failure; at least
        ``floor_s`` (a Retry-After), within the backoff's maximum."""
        attempt = self._failures.get(key, 0)
        self._failures[key] = attempt + 1
        return self._backoff.delay(attempt, self._rng, floor_s=floor_s)

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: K) -> None:
        """``key`` succeeded: its next failure starts from the first delay again."""
        self._failures.pop(key, None)


# A key's place: (priority, order added); lower goes first.
Stamp = tuple[int, int]


class WorkQueue(Generic[K]):
    """The queue of keys (the module docstring); runs on one event loop."""

    def __init__(self, *, rate_limiter: ItemBackoff[K]) -> None:
        self._limiter = rate_limiter
        self._heap: list[tuple[int, int, K]] = []
        self._dirty: dict[K, Stamp] = {}  # key -> the place it is (or will be) queued at
        self._processing: dict[K, Stamp] = {}  # key -> the place it was handed out from
        self._kept: dict[K, Stamp] = {}  # a retry's place, for when it is queued again
        self._waiting: dict[K, tuple[float, asyncio.TimerHandle]] = {}  # add_after timers
        self._order = itertools.count()
        self._getters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._idle = asyncio.Event()
        self._idle.set()
        self._shutting_down = False
        self._resume: asyncio.TimerHandle | None = None  # set while paused

    def __len__(self) -> int:
        """Keys queued and not yet handed out (not those processing or waiting)."""
        return sum(1 for key in self._dirty if key not in self._processing)

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def processing(self, key: K) -> bool:
        return key in self._processing

    def waiting(self, key: K) -> bool:
        """Whether ``key`` is due later (:meth:`add_after`, :meth:`add_rate_limited`)."""
        return key in self._waiting

    def add(self, key: K, *, priority: int = 0) -> None:
        """Queue ``key`` (lower ``priority`` first; a key whose retry was pending keeps
        its place, at this priority if it is higher). Queued already at a place as good
        or better: nothing changes. Processing: queued again when it is done."""
        if self._shutting_down:
            return
        kept = self._kept.pop(key, None)
        if kept is not None:
            stamp = (min(priority, kept[0]), kept[1])
        else:
            stamp = (priority, next(self._order))
        queued = self._dirty.get(key)
        if queued is not None and queued <= stamp:
            return
        self._dirty[key] = stamp
        if key in self._processing:
            return  # done() queues it
        # An entry at a worse place stays in the heap; get() skips it.
        heapq.heappush(self._heap, (*stamp, key))
        self._wake(1)

    def add_after(self, key: K, delay_s: float, *, priority: int = 0) -> None:
        """Queue ``key`` once ``delay_s`` has passed; an earlier request stands."""
        if self._shutting_down:
            return
        if delay_s <= 0:
            self.add(key, priority=priority)
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay_s
        current = self._waiting.get(key)
        if current is not None:
            if current[0] <= due:
                return
            current[1].cancel()
        handle = loop.call_later(delay_s, self._due, key, priority)
        self._waiting[key] = (due, handle)

    def add_rate_limited(self, key: K, *, floor_s: float | None = None) -> float:
        """Queue ``key`` after its backoff (at least ``floor_s``: a Retry-After), at the
        place it was handed out from (processing now) or is kept at; the delay."""
        priority = self._keep(key)
        delay = self._limiter.when(key, floor_s=floor_s)
        self.add_after(key, delay, priority=priority)
        return delay

    def requeue(self, key: K) -> None:
        """Queue ``key`` again at once, at the place it was handed out from (a try the
        server turned away as a whole, not this key: no backoff of its own)."""
        self.add(key, priority=self._keep(key))

    def _keep(self, key: K) -> int:
        """Keep the place ``key`` was handed out from (or an earlier one kept); its
        priority (0 for a key with no place)."""
        stamp = self._processing.get(key)
        kept = self._kept.get(key)
        if stamp is not None and (kept is None or stamp < kept):
            self._kept[key] = kept = stamp
        return kept[0] if kept is not None else 0

    def pause(self, delay_s: float) -> None:
        """Hand out no key for ``delay_s`` (a later end than one set already wins)."""
        if self._shutting_down or delay_s <= 0:
            return
        loop = asyncio.get_running_loop()
        until = loop.time() + delay_s
        if self._resume is not None:
            if until <= self._resume.when():
                return
            self._resume.cancel()
        self._resume = loop.call_at(until, self._end_pause)

    def paused(self) -> bool:
        return self._resume is not None

    def _end_pause(self) -> None:
        self._resume = None
        self._wake(len(self._getters))

    def forget(self, key: K) -> None:
        """Reset ``key``'s backoff (it succeeded) and drop a retry it has waiting."""
        self._limiter.forget(key)
        self._kept.pop(key, None)
        self.cancel_wait(key)

    def cancel_wait(self, key: K) -> None:
        waiting = self._waiting.pop(key, None)
        if waiting is not None:
            waiting[1].cancel()

    def failures(self, key: K) -> int:
        return self._limiter.failures(key)

    async def get(self) -> K | None:
        """The next key, now processing; None once the queue is shutting down."""
        while True:
            if self._shutting_down:
                return None
            popped = None if self._resume is not None else self._pop()
            if popped is not None:
                key, stamp = popped
                self._processing[key] = stamp
                self._idle.clear()
                return key
            waiter = asyncio.get_running_loop().create_future()
            self._getters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake(1)  # woken, then cancelled: the key is someone else's
                raise
            finally:
                if waiter in self._getters:
                    self._getters.remove(waiter)

    def done(self, key: K) -> None:
        """Processing ``key`` has ended; if it was added meanwhile, it is queued again."""
        self._processing.pop(key, None)
        if self._shutting_down:
            self._dirty.pop(key, None)
        elif key in self._dirty:
            heapq.heappush(self._heap, (*self._dirty[key], key))
            self._wake(1)
        if not self._processing:
            self._idle.set()

    def shut_down(self) -> None:
        """Take no new key, drop those queued and waiting; :meth:`get` returns None."""
        self._shutting_down = True
        for _, handle in self._waiting.values():
            handle.cancel()
        self._waiting.clear()
        self._kept.clear()
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        self._heap.clear()
        self._dirty = {key: p for key, p in self._dirty.items() if key in self._processing}
        self._wake(len(self._getters))

    async def shut_down_with_drain(self) -> None:
        """:meth:`shut_down`, then wait until every key handed out is done."""
        self.shut_down()
        await self._idle.wait()

    def _pop(self) -> tuple[K, Stamp] | None:
        while self._heap:
            priority, order, key = heapq.heappop(self._heap)
            if self._dirty.get(key) != (priority, order) or key in self._processing:
                continue  # overtaken by the same key at a better place, or stale
            del self._dirty[key]
            return key, (priority, order)
        return None

    def _due(self, key: K, priority: int) -> None:
        self._waiting.pop(key, None)
        self.add(key, priority=priority)

    def _wake(self, count: int) -> None:
        while count > 0 and self._getters:
            waiter = self._getters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                count -= 1
