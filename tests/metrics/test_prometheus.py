"""A real Prometheus server (Debian's package) scrapes a running agent every second."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.metrics.prometheus import query, scraping
from tests.metrics.support import free_port, running_agent

SCRAPE_WAIT_S = 30.0


def by_label(result: list[dict[str, Any]], label: str) -> dict[str, float]:
    return {series["metric"][label]: float(series["value"][1]) for series in result}


@pytest.mark.slow
def test_prometheus_scrapes_the_agent(tmp_path: Path):
    """Prometheus finds every cycle-result series, a ready agent and its GPUs' caps."""
    metrics_port = free_port()
    args = ["--metrics-port", str(metrics_port), "--metrics-address", "127.0.0.1"]
    with running_agent(tmp_path, args) as agent:
        agent.wait_for(rf"metrics serving address=127\.0\.0\.1:{metrics_port} ")
        with scraping(tmp_path, {"capwatch": f"127.0.0.1:{metrics_port}"}) as api:
            deadline = time.monotonic() + SCRAPE_WAIT_S
            while True:
                try:
                    cycles = by_label(query(api, "capwatch_cycles_total"), "result")
                    ready = query(api, 'capwatch_ready{job="capwatch"}')
                except OSError:  # not listening yet
                    cycles, ready = {}, []
                if cycles.get("enforced", 0) > 0 and ready and ready[0]["value"][1] == "1":
                    break
                assert time.monotonic() < deadline, f"no scrape in {SCRAPE_WAIT_S}s: {cycles}"
                time.sleep(0.25)
            assert set(cycles) == {"enforced", "failed", "aborted"}
            assert cycles["aborted"] == 0
            up = query(api, 'up{job="capwatch"}')
            assert [s["value"][1] for s in up] == ["1"]
            applied = by_label(query(api, "capwatch_gpu_applied_cap_watts"), "gpu")
            assert set(applied) == {str(i) for i in range(6)}  # the built-in scenario's GPUs
            info = query(api, "capwatch_info")
            assert [s["metric"]["node"] for s in info] == ["sim-node-0"]
    assert agent.proc.returncode == 0, agent.log
