"""Every dashboard expression, evaluated by a real Prometheus scraping a running sim agent
and a dry-run controller following it, returns series."""

from __future__ import annotations

from pathlib import Path

import pytest

from dashboards.capwatch import expressions
from tests.controller.e2e.processes import Processes
from tests.dashboard.names import EVENT_DRIVEN, names_in
from tests.dashboard.prom import instant, wait_scraped
from tests.metrics.prometheus import scraping
from tests.metrics.support import free_port, running_agent

pytestmark = pytest.mark.slow

JOIN = frozenset({"capwatch_info"})


def may_be_empty(expr: str) -> bool:
    """Whether ``expr`` reads only event-driven metrics: their panels may show nothing on
    a healthy node, but must still evaluate."""
    read = names_in(expr) - JOIN
    return bool(read) and read <= EVENT_DRIVEN


@pytest.mark.timeout(120)
def test_every_dashboard_expression_returns_series(tmp_path: Path):
    """A sim agent and a controller in --dry-run following it, both scraped every second:
    each panel's query, as Grafana sends it with "All" nodes and GPUs, evaluates without
    error and returns at least one series (event-driven ones may be empty); a chosen node
    keeps its series and an unknown one filters them all out."""
    agent_metrics, controller_metrics = free_port(), free_port()
    args = ["--metrics-port", str(agent_metrics), "--metrics-address", "127.0.0.1"]
    processes = Processes(tmp_path)
    with running_agent(tmp_path, args) as agent:
        agent.wait_for(rf"metrics serving address=127\.0\.0\.1:{agent_metrics} ")
        targets = tmp_path / "targets"
        targets.write_text(f"sim-node-0 {agent.grpc_target.split(',')[0]}\n")
        controller = processes.start(
            "controller",
            [
                "controller",
                *("--dry-run", "--targets", str(targets)),
                *("--grpc-listen", "127.0.0.1:0", "--probe-port", "0"),
                *("--metrics-port", str(controller_metrics)),
            ],
        )
        jobs = {
            "capwatch": f"127.0.0.1:{agent_metrics}",
            "capwatch-controller": f"127.0.0.1:{controller_metrics}",
        }
        try:
            with scraping(tmp_path, jobs) as api:
                wait_scraped(api, jobs, samples=5, timeout=60)
                empty = [e for e in expressions() if not instant(api, e)]
                ready = expressions()[0]
                assert "capwatch_ready" in ready
                chosen = instant(api, ready, {"$node": "sim-node-0", "$gpu": ".*"})
                other = instant(api, ready, {"$node": "no-such-node", "$gpu": ".*"})
        finally:
            processes.close()
        assert controller.popen.returncode == 0, controller.log
    assert [e for e in empty if not may_be_empty(e)] == []
    assert chosen
    assert other == []
