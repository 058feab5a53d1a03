"""A real Prometheus server (Debian's package) for the dashboard's tests, and its queries.

``scraping`` runs Prometheus on a private TSDB, scraping the given targets every
second; ``instant`` evaluates a dashboard expression the way Grafana would send
it, its variables replaced. Built on tests/metrics/prometheus.py.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from tests.metrics.prometheus import query

# What Grafana puts in for the variables: "All" nodes and GPUs is the regex .*, and
# $__rate_interval is at least four scrape intervals (1 s here).
ALL = {"$node": ".*", "$gpu": ".*"}
RATE_INTERVAL = "15s"


def substitute(expr: str, variables: Mapping[str, str] = ALL) -> str:
    """``expr`` with the dashboard's variables replaced, as Grafana sends it."""
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    for name, value in variables.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"an unknown variable in {expr}"
    return expr


def instant(api: str, expr: str, variables: Mapping[str, str] = ALL) -> list[dict[str, Any]]:
    """The instant vector a dashboard expression evaluates to now (a failure if it errs)."""
    return query(api, substitute(expr, variables))


def wait_scraped(api: str, jobs: Mapping[str, str], *, samples: int, timeout: float) -> None:
    """Until every job is up and has been scraped at least ``samples`` times."""
    deadline = time.monotonic() + timeout
    expr = "count_over_time(up[1m]) and on(job, instance) up == 1"
    while True:
        try:
            counts = {s["metric"]["job"]: float(s["value"][1]) for s in query(api, expr)}
        except OSError:  # not listening yet
            counts = {}
        if all(counts.get(job, 0) >= samples for job in jobs):
            return
        assert time.monotonic() < deadline, f"not scraped {samples} times in {timeout}s: {counts}"
        time.sleep(0.25)
