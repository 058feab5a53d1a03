"""Every metric a dashboard panel reads is documented (docs/metrics.md stays the single
list) and exposed by a running agent or by the controller's registry."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest

from capwatch.controller.metrics import ControllerMetrics
from dashboards.capwatch import expressions
from tests.dashboard.names import DEVICE_METRICS, EVENT_DRIVEN, documented, family, names_in
from tests.metrics.support import free_port, http_get, running_agent, samples


def dashboard_names() -> set[str]:
    return {name for expr in expressions() for name in names_in(expr)}


def agent_samples(tmp_path: Path) -> tuple[set[str], str]:
    """Every sample name a sim agent's /metrics serves, read over HTTP, and the text."""
    port = free_port()
    args = ["--metrics-port", str(port), "--metrics-address", "127.0.0.1"]
    with running_agent(tmp_path, args) as agent:
        agent.wait_for(r"cycle seq=2 ")
        text = http_get(f"http://127.0.0.1:{port}/metrics")
    return {name for name, _ in samples(text)}, text


def controller_samples() -> set[str]:
    """Every sample name of the controller's registry, built as tests/controller does."""
    metrics = ControllerMetrics(
        states=dict, leading=lambda: True, shard=0, shards=1, identity="c-0", version="9.9.9"
    )
    return {name for name, _ in samples(generate_latest(metrics.registry).decode())}


def test_names_are_found_in_each_kind_of_expression():
    """The name extraction sees through functions, matchers, joins and histogram samples,
    and takes no function or label for a metric."""
    expr = (
        'histogram_quantile(0.99, sum by (le) (rate(capwatch_x_seconds_bucket{gpu=~"$gpu"}'
        "[5m]))) * on(instance, job) group_left(node) capwatch_info and capwatch_y == 1"
    )
    assert names_in(expr) == {"capwatch_x_seconds_bucket", "capwatch_info", "capwatch_y"}
    assert family("capwatch_x_seconds_bucket", {"capwatch_x_seconds"}) == "capwatch_x_seconds"
    assert family("capwatch_cycles_total", {"capwatch_x_seconds"}) == "capwatch_cycles_total"
    assert family("capwatch_count", set()) == "capwatch_count"


def test_every_dashboard_metric_is_in_docs_metrics_md():
    """Each name a panel reads is a row of docs/metrics.md (a histogram's samples by the
    histogram's row)."""
    docs = documented()
    histograms = {name for name, kind in docs.items() if kind == "histogram"}
    assert {"capwatch_cycles_total", "capwatch_controller_leader"} <= set(docs)
    assert "capwatch_cycle_duration_seconds" in histograms
    missing = {n for n in dashboard_names() if family(n, histograms) not in docs}
    assert missing == set(), f"not in docs/metrics.md: {sorted(missing)}"


@pytest.mark.slow
def test_every_dashboard_metric_is_exposed(tmp_path: Path):
    """Each name a panel reads is a sample a running sim agent serves on /metrics or one
    of the controller's registry; an event-driven counter, with no sample before its
    first event, is at least declared (its TYPE line)."""
    served, text = agent_samples(tmp_path)
    exposed = served | controller_samples()
    assert "capwatch_cycle_duration_seconds_bucket" in exposed
    assert "capwatch_controller_detection_latency_seconds_bucket" in exposed
    declared = {n for n in EVENT_DRIVEN if f"# TYPE {n} counter" in text}
    assert declared == EVENT_DRIVEN
    missing = dashboard_names() - exposed - declared
    assert missing == set(), f"not exposed: {sorted(missing)}"


def test_the_dashboard_reads_every_device_metric():
    """Every device-health metric has a panel."""
    assert dashboard_names() >= DEVICE_METRICS
