"""The fan-out's tail for bench/stream.py: the p99 of every delivery of a run's rounds, and
how much of it fell in cycles during which the server's collector ran a full pass."""

from __future__ import annotations

import statistics
from typing import Any


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98]


def pooled_p99(results: list[dict[str, Any]], leave_out: int | None = None) -> float:
    """The p99 of every delivery of these rounds (but round ``leave_out``)."""
    return p99([x for i, f in enumerate(results) if i != leave_out for x in f["ms"]])


def collections_line(results: list[dict[str, Any]], cycles: int) -> str:
    """The full collections of these fan-out rounds, and how much of the tail they hold."""
    pauses = [x for f in results for x in f["gc_ms"]]
    if not pauses:
        return "no full collection"
    line = (
        f"{len(pauses)} full collections, {statistics.median(pauses):.0f} ms median, "
        f"{max(pauses):.0f} ms longest"
    )
    if any(f["gc_cycles"] is None for f in results):
        return line
    threshold = pooled_p99(results)
    tail = hit = hit_cycles = 0
    for f in results:
        hit_cycles += len(f["gc_cycles"])
        for i, x in enumerate(f["ms"]):
            if x > threshold:
                tail += 1
                hit += i % cycles in f["gc_cycles"]
    return (
        f"{line}; {hit / tail:.0%} of the deliveries over the p99 were in the "
        f"{hit_cycles / (cycles * len(results)):.0%} of cycles one began in"
    )
