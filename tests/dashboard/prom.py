"""A real Prometheus server (Debian's package) for the dashboard's tests, and its queries.

``scraping`` runs Prometheus on a private TSDB, scraping the given targets every
second; ``instant`` evaluates a dashboard expression the way Grafana would send
it, its variables replaced. Built on tests/metrics/test_prometheus.py's helpers.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.metrics.support import free_port
from tests.metrics.test_prometheus import prometheus_binary, query

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


@contextmanager
def scraping(tmp_path: Path, jobs: Mapping[str, str]) -> Iterator[str]:
    """Prometheus scraping each job's ``host:port`` every second; yields its API's URL."""
    web_port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n"
        + "".join(
            f"  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']\n"
            for job, target in jobs.items()
        )
    )
    server = subprocess.Popen(
        [
            prometheus_binary(),
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{web_port}",
            "--log.level=warn",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield f"http://127.0.0.1:{web_port}"
        assert server.poll() is None, server.communicate()[1]
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=15)
        finally:
            server.kill()
            if server.stderr is not None:
                server.stderr.close()


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
