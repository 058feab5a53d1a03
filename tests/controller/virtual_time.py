"""An asyncio event loop on virtual time, and a :class:`~capwatch.kit.clock.Clock` that reads it.

When the loop has nothing ready to run it does not wait for its next timer: it
moves its clock to that timer at once. Sleeps, ``call_later`` timers and
``asyncio.timeout`` deadlines behave exactly as on a real loop, in order and
to the instant, but take no wall time: the controller's backoffs, heartbeats,
lease timings and staleness timers are tested to the exact second, and a
loaded machine cannot make them flake. Sockets still work (they are polled
before time moves); work on other threads does not (time would run ahead of
it), so tests that use threads run on a real loop.
"""

from __future__ import annotations

import asyncio
import selectors
import threading

START = 1000.0
WALL_OFFSET = 1_750_000_000.0 - START


class _JumpingSelector(selectors.DefaultSelector):
    def __init__(self, start: float) -> None:
        super().__init__()
        self.now = start

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            # No timer at all: only I/O or another thread can wake the loop.
            return super().select(None)
        self.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose ``time()`` jumps to the next timer when idle."""

    def __init__(self, start: float = START) -> None:
        self._jumping = _JumpingSelector(start)
        super().__init__(self._jumping)

    def time(self) -> float:
        return self._jumping.now

    def spend(self, seconds: float) -> None:
        """Hold the loop for ``seconds`` of its time, as a blocking call on it would."""
        self._jumping.now += seconds


class LoopClock:
    """A Clock on the running loop's time: ``monotonic`` is ``loop.time()``, ``wall`` the
    same plus an offset (which :meth:`step_wall` moves, as an NTP step would)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._wall_offset = WALL_OFFSET

    def monotonic(self) -> float:
        return self._loop.time()

    def wall(self) -> float:
        return self._loop.time() + self._wall_offset

    def step_wall(self, seconds: float) -> None:
        self._wall_offset += seconds

    def sleep(self, seconds: float, stop: threading.Event | None = None) -> bool:
        raise AssertionError("the controller's loop code must not block on clock.sleep")
