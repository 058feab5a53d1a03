"""The in-process hub the loop publishes every CycleReport into.

Readers (the Watch stream's feed, the DRA streams, metrics, the readiness
tracker) never block the publisher: ``publish`` appends to a bounded ring
buffer and wakes waiters with one O(1) operation whatever their number. A
reader that falls further behind than the ring holds is told so (``since``
returns None) and resyncs from the latest snapshot instead of holding memory
for it.

Publishing happens on the cycle thread; asyncio readers are woken through
``loop.call_soon_threadsafe`` on the loops they attached, so the cost to the
cycle is one call per attached event loop, not per reader.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from capwatch.agent.devices import DeviceState, fold
from capwatch.agent.reports import CycleReport
from capwatch.kit.clock import Clock
from capwatch.kit.readiness import Readiness, evaluate

DEFAULT_CAPACITY = 256


@dataclass(frozen=True, kw_only=True)
class HubState:
    """A consistent view of the hub at one moment."""

    sequence: int  # of the latest report; 0 before any
    latest: CycleReport | None
    last_good_monotonic: float | None  # finish time of the last enforced cycle
    devices: Mapping[int, DeviceState] = field(default_factory=lambda: MappingProxyType({}))


class Hub:
    def __init__(
        self,
        *,
        clock: Clock,
        stale_after_s: float,
        capacity: int = DEFAULT_CAPACITY,
        instance_id: str | None = None,
        devices: Mapping[int, DeviceState] | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be positive")
        # New for every agent start: sequence numbers restart with it.
        self.instance_id = instance_id or str(uuid.uuid4())
        self._clock = clock
        self._stale_after_s = stale_after_s
        self._capacity = capacity
        self._ring: deque[CycleReport] = deque(maxlen=capacity)
        # The device table right after each buffered report, so a reader sent a
        # cycle late (a batch, a resume) still sees that cycle's transition times.
        self._tables: deque[Mapping[int, DeviceState]] = deque(maxlen=capacity)
        self._state = HubState(
            sequence=0,
            latest=None,
            last_good_monotonic=None,
            devices=MappingProxyType(dict(devices or {})),
        )
        self._readers_released = False
        self._lock = threading.Lock()
        self._loops: dict[asyncio.AbstractEventLoop, asyncio.Event] = {}
        # Loops with a wake-up already scheduled: a burst of publishes costs each
        # loop one wake-up (one write to its self-pipe), not one per publish.
        self._waking: set[asyncio.AbstractEventLoop] = set()

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def stale_after_s(self) -> float:
        return self._stale_after_s

    @property
    def capacity(self) -> int:
        """How many reports the ring holds."""
        return self._capacity

    def publish(self, report: CycleReport) -> None:
        """Record a completed cycle, then wake readers. O(1) in the number of readers.

        Readers can see the report once it is recorded. Waking them comes
        after: the publishing thread may then wait for the GIL while they run.
        """
        for loop in self._record(report):
            self._schedule_wake(loop)

    def _record(self, report: CycleReport) -> list[asyncio.AbstractEventLoop]:
        """Make ``report`` the latest; return the loops to wake."""
        with self._lock:
            last_good = (
                report.finished_monotonic if report.enforced else self._state.last_good_monotonic
            )
            devices = MappingProxyType(fold(self._state.devices, report))
            self._ring.append(report)
            self._tables.append(devices)
            self._state = HubState(
                sequence=report.sequence,
                latest=report,
                last_good_monotonic=last_good,
                devices=devices,
            )
            loops = [loop for loop in self._loops if loop not in self._waking]
            self._waking.update(loops)
            return loops

    def state(self) -> HubState:
        with self._lock:
            return self._state

    def readiness(self, state: HubState | None = None, *, now: float | None = None) -> Readiness:
        """The readiness rule applied to ``state`` (default: the current one) at monotonic
        instant ``now`` (default: now)."""
        state = state or self.state()
        if now is None:
            now = self._clock.monotonic()
        latest = state.latest
        return evaluate(
            last_cycle_enforced=None if latest is None else latest.enforced,
            last_cycle_age_s=None if latest is None else now - latest.finished_monotonic,
            last_good_age_s=None
            if state.last_good_monotonic is None
            else now - state.last_good_monotonic,
            stale_after_s=self._stale_after_s,
            failure_summary="" if latest is None else latest.failure_summary,
        )

    def since(self, sequence: int) -> tuple[CycleReport, ...] | None:
        """Reports after ``sequence``, oldest first; None when some are gone (resync)."""
        with self._lock:
            if sequence >= self._state.sequence:
                return ()
            if not self._ring or self._ring[0].sequence > sequence + 1:
                return None
            # Sequences in the ring are consecutive, so the reader's position is
            # found by arithmetic: a reader that is up to date pays O(1), not a
            # scan of the whole ring, on every wake.
            start = sequence + 1 - self._ring[0].sequence
            if 0 <= start < len(self._ring) and self._ring[start].sequence == sequence + 1:
                # Indexed from the right: near the end of a deque that is O(1).
                return tuple(self._ring[i] for i in range(start - len(self._ring), 0))
            return tuple(r for r in self._ring if r.sequence > sequence)

    def history(self, after: int) -> tuple[tuple[CycleReport, Mapping[int, DeviceState]], ...]:
        """Every buffered report after ``after``, oldest first, each with the device table
        right after it. Where some are gone already, the first one returned is the
        oldest still held: the caller sees the gap in the sequences."""
        with self._lock:
            if not self._ring or after >= self._state.sequence:
                return ()
            start = max(0, after + 1 - self._ring[0].sequence)
            if start == len(self._ring) - 1:  # the usual case: one new report
                return ((self._ring[-1], self._tables[-1]),)
            return tuple(itertools.islice(zip(self._ring, self._tables, strict=True), start, None))

    def devices_at(self, sequence: int) -> Mapping[int, DeviceState] | None:
        """The device table right after cycle ``sequence``; None once it left the ring."""
        with self._lock:
            if not self._ring:
                return None
            offset = sequence - self._ring[0].sequence
            if not 0 <= offset < len(self._ring):
                return None
            return self._tables[offset]

    def release_readers(self) -> None:
        """Make every current and future :meth:`wait` return at once (server shutdown)."""
        with self._lock:
            self._readers_released = True
            loops = list(self._loops)
        for loop in loops:
            self._schedule_wake(loop)

    def _schedule_wake(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            loop.call_soon_threadsafe(self._wake, loop)
        except RuntimeError:  # that loop closed; forget it
            with self._lock:
                self._loops.pop(loop, None)
                self._waking.discard(loop)

    def _wake(self, loop: asyncio.AbstractEventLoop) -> None:
        # Runs on ``loop``. Sets the loop's current event: a reader may have
        # replaced the one that was current when the wake-up was scheduled.
        with self._lock:
            self._waking.discard(loop)
            event = self._loops.get(loop)
        if event is not None:
            event.set()

    @property
    def readers_released(self) -> bool:
        return self._readers_released

    async def wait(self, after_sequence: int, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        """Await a report newer than ``after_sequence``; False on timeout or release."""
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if self._state.sequence > after_sequence:
                    return True
                if self._readers_released:
                    return False
                event = self._loops.get(loop)
                if event is None or event.is_set():
                    event = self._loops[loop] = asyncio.Event()
            try:
                # asyncio.timeout, not wait_for: no extra task per wake (3.11).
                async with asyncio.timeout(timeout):
                    await event.wait()
            except TimeoutError:
                return False
