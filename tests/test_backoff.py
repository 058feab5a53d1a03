"""The one backoff (kit/backoff.py): exponential, capped without overflow, full jitter."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capwatch.kit.backoff import Backoff
from capwatch.kit.errors import ConfigError


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


BACKOFFS = st.builds(
    lambda initial, factor, multiplier: Backoff(
        initial_s=initial, max_s=initial * factor, multiplier=multiplier
    ),
    st.floats(1e-3, 10),
    st.floats(1, 1e6),
    st.floats(1, 16),
)


@given(backoff=BACKOFFS, attempt=st.integers(0, 10**6), seed=st.integers(0, 2**32))
def test_property_any_attempt_waits_within_a_ceiling_that_never_overflows(
    backoff: Backoff, attempt: int, seed: int
):
    """Up to a million failures in a row, with any valid parameters: the ceiling is a
    finite number in [initial, max], never decreasing with the attempt, and the wait
    is in [0, ceiling]; nothing raises (``initial * 2**1024`` would)."""
    ceiling = backoff.ceiling(attempt)
    assert backoff.initial_s <= ceiling <= backoff.max_s
    assert backoff.ceiling(attempt + 1) >= ceiling
    assert 0 <= backoff.delay(attempt, random.Random(seed)) <= ceiling


@given(backoff=BACKOFFS, attempt=st.integers(0, 10**6), floor=st.floats(0, 1e9))
def test_property_retry_after_is_a_floor_capped_at_the_maximum(
    backoff: Backoff, attempt: int, floor: float
):
    """A server's Retry-After is waited out, but never past ``max_s``."""
    wait = backoff.delay(attempt, random.Random(1), floor_s=floor)
    assert min(floor, backoff.max_s) <= wait <= max(backoff.max_s, backoff.ceiling(attempt))


def test_a_negative_attempt_is_a_programming_error():
    """Attempts count from 0; a negative one is refused rather than read as the first."""
    with pytest.raises(ValueError, match="negative"):
        Backoff().ceiling(-1)


@pytest.mark.parametrize("floor", [math.inf, 1e300, 3600.0])
def test_an_unbounded_retry_after_waits_the_maximum(floor: float):
    """Retry-After: 3600, 1e300 or infinity waits ``max_s``, not an hour or for ever."""
    backoff = Backoff(initial_s=0.5, max_s=60.0)
    assert backoff.delay(0, random.Random(1), floor_s=floor) == 60.0


@pytest.mark.parametrize("floor", [math.nan, -5.0, -math.inf])
def test_a_retry_after_that_is_no_number_or_negative_is_ignored(floor: float):
    """A NaN or negative Retry-After is no floor: the backoff's own wait stands."""
    backoff = Backoff(initial_s=0.5, max_s=60.0)
    assert backoff.delay(0, random.Random(1), floor_s=floor) == backoff.delay(0, random.Random(1))
