"""The reconnect backoff policy: exponential, capped, full jitter."""

from __future__ import annotations

import random

import pytest

from client.node_health import Backoff
from kit.errors import ConfigError


def test_default_ceiling_doubles_from_200ms_up_to_10s():
    """Defaults: 0.2 s doubling per failure, capped at 10 s, even after very many failures."""
    backoff = Backoff()
    assert [backoff.ceiling(n) for n in range(8)] == [0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0]
    assert backoff.ceiling(100_000) == 10.0


def test_delay_is_uniform_below_the_ceiling():
    """Each wait is drawn from uniform(0, ceiling) of the Random given, so runs repeat by seed."""
    backoff = Backoff(initial_s=1, max_s=4)
    waits = [backoff.delay(n, random.Random(3)) for n in range(5)]
    assert waits == [random.Random(3).uniform(0, c) for c in (1, 2, 4, 4, 4)]
    spread = [backoff.delay(9, random.Random(seed)) for seed in range(200)]
    assert all(0 <= wait <= 4 for wait in spread)
    assert min(spread) < 1  # full jitter, not a fixed wait
    assert max(spread) > 3


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial_s": 0},
        {"initial_s": 5, "max_s": 1},
        {"max_s": float("inf")},
        {"multiplier": 0.5},
        {"multiplier": float("nan")},
    ],
)
def test_invalid_backoff_is_a_config_error(kwargs: dict[str, float]):
    """Backoff parameters that would spin or never retry are refused up front."""
    with pytest.raises(ConfigError):
        Backoff(**kwargs)
