"""Warnings that cannot flood a log: a token bucket per source of repeated trouble.

Used wherever an outsider or a failing device can cause the same warning again
and again (malformed requests, refused streams, NVML event waits): a burst goes
through, then one line per refill period, each saying how many were held back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

THROTTLE_BURST = 10  # lines let through at once
THROTTLE_REFILL_S = 6.0  # then one line per this many seconds (10 a minute)


class ThrottledLog:
    """Warnings through ``logger``, at most ``burst`` at once and one per ``refill_s`` after
    (a token bucket); the rest are counted and reported with the next line let through."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        burst: int = THROTTLE_BURST,
        refill_s: float = THROTTLE_REFILL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._burst = burst
        self._refill_s = refill_s
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()
        self.suppressed = 0  # since the last line let through

    def warning(self, message: str, *args: object) -> None:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._last) / self._refill_s)
        self._last = now
        if self._tokens < 1:
            self.suppressed += 1
            return
        self._tokens -= 1
        if self.suppressed:
            message += " (%d similar lines suppressed)"
            args = (*args, self.suppressed)
            self.suppressed = 0
        self._logger.warning(message, *args)
