"""Clocks, behind a small protocol so tests can step time deterministically.

Readiness and every age the agent reports use the monotonic clock; the wall
clock is for humans (timestamps in reports) and never decides anything.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never steps backwards."""
        ...

    def wall(self) -> float:
        """Seconds since the Unix epoch, for display only."""
        ...

    def sleep(self, seconds: float, stop: threading.Event | None = None) -> bool:
        """Sleep, returning early (True) if ``stop`` is set."""
        ...


class SystemClock:
    """The real clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def sleep(self, seconds: float, stop: threading.Event | None = None) -> bool:
        if stop is None:
            time.sleep(max(0.0, seconds))
            return False
        return stop.wait(max(0.0, seconds))


class FakeClock:
    """A manually advanced clock. ``sleep`` advances it instantly."""

    def __init__(self, *, monotonic: float = 1000.0, wall: float = 1_750_000_000.0) -> None:
        self._mono = monotonic
        self._wall = wall
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def wall(self) -> float:
        with self._lock:
            return self._wall

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._mono += seconds
            self._wall += seconds

    def step_wall(self, seconds: float) -> None:
        """Step only the wall clock (NTP jump); the monotonic clock is unaffected."""
        with self._lock:
            self._wall += seconds

    def sleep(self, seconds: float, stop: threading.Event | None = None) -> bool:
        if stop is not None and stop.is_set():
            return True
        self.advance(max(0.0, seconds))
        return False
