"""How long a subscriber waits before reconnecting to an agent.

:class:`Backoff` is exponential with full jitter: failure ``attempt`` (0 for the
first since a message arrived) waits a uniformly random time in
``[0, min(max_s, initial_s * multiplier**attempt)]``, 0.2 s doubling to 10 s by
default, so thousands of clients cut off at once do not reconnect in step.

On a unix socket (:func:`is_local`) the agent is on this machine: a refused
connect costs microseconds, nobody else's connections are at stake, and the
agent is back the moment its process is. There the ceiling is capped at the
agent's interval once known, and at :data:`LOCAL_BACKOFF_MAX_S` (1 s) in any
case (:func:`local_backoff`), so the ``/readyz`` shim is streaming again within
about one interval of the agent's return rather than up to 10 s later. grpc's
own reconnect backoff must not add a delay of its own: every attempt uses a new
channel (so it never applies), and on a unix socket it is also capped at 1 s
(:data:`LOCAL_CHANNEL_OPTIONS`).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from typing import Any

from kit.errors import ConfigError

LOCAL_BACKOFF_MAX_S = 1.0
LOCAL_CHANNEL_OPTIONS: Sequence[tuple[str, Any]] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", int(LOCAL_BACKOFF_MAX_S * 1000)),
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Backoff:
    """Exponential backoff with full jitter (the module docstring)."""

    initial_s: float = 0.2
    max_s: float = 10.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.max_s) and 0 < self.initial_s <= self.max_s):
            raise ConfigError("backoff", "need 0 < initial_s <= max_s, both finite")
        if not (math.isfinite(self.multiplier) and self.multiplier >= 1):
            raise ConfigError("backoff", "multiplier must be at least 1")

    def ceiling(self, attempt: int) -> float:
        try:
            return min(self.max_s, self.initial_s * self.multiplier**attempt)
        except OverflowError:
            return self.max_s

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0.0, self.ceiling(attempt))


def is_local(target: str) -> bool:
    """A unix socket (``unix:``, ``unix-abstract:``): the agent on this machine."""
    return target.startswith("unix")


def local_backoff(backoff: Backoff, *, interval_s: float | None) -> Backoff:
    """``backoff`` with its ceiling capped at ``interval_s`` (if known) and at 1 s."""
    cap = min(backoff.max_s, LOCAL_BACKOFF_MAX_S, interval_s or math.inf)
    return dataclasses.replace(backoff, initial_s=min(backoff.initial_s, cap), max_s=cap)
