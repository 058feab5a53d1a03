"""How long to wait before trying again: the one backoff capwatch has.

:class:`Backoff` is exponential with full jitter: failure ``attempt`` (0 for the
first in a row) waits a uniformly random time in
``[0, min(max_s, initial_s * multiplier**attempt)]``, so thousands of clients
cut off at once do not come back in step. The stream clients (0.2 s doubling to
10 s), the informer's list and watch and the controller's writes (through its
work queue) all wait by it.

For a subscriber on a unix socket (:func:`is_local`), the agent is on this machine: a refused
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
import sys
from collections.abc import Sequence
from typing import Any

from capwatch.kit.errors import ConfigError

LOCAL_BACKOFF_MAX_S = 1.0
LOCAL_CHANNEL_OPTIONS: Sequence[tuple[str, Any]] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", int(LOCAL_BACKOFF_MAX_S * 1000)),
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Backoff:
    """Exponential backoff with full jitter, the one capwatch uses everywhere.

    Failure ``attempt`` (0 for the first in a row) waits a uniformly random time
    in ``[0, ceiling(attempt)]``, where the ceiling is ``initial_s *
    multiplier**attempt`` up to ``max_s``. The ceiling is computed without
    raising the multiplier past the attempt where it reaches ``max_s``, so no
    attempt count overflows (a node refused for days keeps retrying at the
    ceiling). A server's Retry-After is a floor on the wait, itself capped at
    ``max_s``: a server asking for hours cannot silence a client for hours.
    """

    initial_s: float = 0.2
    max_s: float = 10.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.max_s) and 0 < self.initial_s <= self.max_s):
            raise ConfigError("backoff", "need 0 < initial_s <= max_s, both finite")
        if not (math.isfinite(self.multiplier) and self.multiplier >= 1):
            raise ConfigError("backoff", "multiplier must be at least 1")

    @property
    def saturation(self) -> int:
        """The first attempt whose ceiling is ``max_s``."""
        if self.multiplier == 1 or self.initial_s == self.max_s:
            return 0 if self.initial_s == self.max_s else sys.maxsize
        return max(0, math.ceil(math.log(self.max_s / self.initial_s, self.multiplier)))

    def ceiling(self, attempt: int) -> float:
        if attempt < 0:
            raise ValueError(f"attempt must not be negative, got {attempt}")
        if attempt >= self.saturation:
            return self.max_s
        return min(self.max_s, self.initial_s * self.multiplier**attempt)

    def delay(self, attempt: int, rng: random.Random, *, floor_s: float | None = None) -> float:
        """A wait for ``attempt``: full jitter under its ceiling, at least ``floor_s``
        (a Retry-After; capped at ``max_s``)."""
        wait = rng.uniform(0.0, self.ceiling(attempt))
        if floor_s is not None and floor_s > wait:
            wait = min(floor_s, self.max_s)
        return wait


def is_local(target: str) -> bool:
    """A unix socket (``unix:``, ``unix-abstract:``): the agent on this machine."""
    return target.startswith("unix")


def local_backoff(backoff: Backoff, *, interval_s: float | None) -> Backoff:
    """``backoff`` with its ceiling capped at ``interval_s`` (if known) and at 1 s."""
    cap = min(backoff.max_s, LOCAL_BACKOFF_MAX_S, interval_s or math.inf)
    return dataclasses.replace(backoff, initial_s=min(backoff.initial_s, cap), max_s=cap)
