"""The arithmetic the benches judge by: percentiles, a total shared out, alternated
rounds, and the verdict printed beside a target."""

from __future__ import annotations

import statistics


def p99(samples: list[float]) -> float:
    """The 99th percentile, interpolated (at least two samples)."""
    return statistics.quantiles(samples, n=100)[98]


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile by nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def spread(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` as even as can be, the larger shares first."""
    return [total // parts + (i < total % parts) for i in range(parts)]


def paired(rounds: int) -> list[tuple[str, str]]:
    """The order of each round's two measurements: bare first, then capwatch first, and so
    on, so a machine slowing down or speeding up through the run favours neither."""
    return [("bare", "ours") if i % 2 == 0 else ("ours", "bare") for i in range(rounds)]


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"
