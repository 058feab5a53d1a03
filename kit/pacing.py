"""A token bucket for asyncio: a rate of work a second, a burst saved up, a wait for the rest.

One implementation for the controller's paced work: the DeviceTaintRule writes (a
mass fault must not write thousands of rules at once) and the dials of its agent
streams (a start, or a failover, must not open thousands of connections at once).
"""

from __future__ import annotations

import asyncio

from capwatch.kit.clock import Clock


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up; :meth:`take` waits for one."""

    def __init__(self, *, rate: float, burst: int, clock: Clock) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("need rate > 0 and burst >= 1")
        self._rate, self._burst, self._clock = rate, float(burst), clock
        self._tokens, self._at = float(burst), clock.monotonic()

    async def take(self) -> None:
        while True:
            now = self._clock.monotonic()
            self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
            self._at = now
            if self._tokens >= 1:
                self._tokens -= 1
                return
            # At least a millisecond: a wait of a float's rounding error would not move
            # the clock, and nothing would refill.
            await asyncio.sleep(max(0.001, (1 - self._tokens) / self._rate))
