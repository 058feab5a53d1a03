"""bench/scenarios/throttling.py at 60 nodes: the real condition writer against the fake API server
throttled to 20 status writes a second writes every node exactly once, is answered 429
meanwhile, and writes every figure."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench_runs import bench


def test_a_throttled_writer_writes_each_node_once_and_reports_every_figure(
    tmp_path: Path,
) -> None:
    """Throttled to 20 writes a second, 60 failing nodes are each written once (none
    twice while another waits), some writes are answered 429, and the baseline run
    without a throttle sees none; both runs' figures are in the JSON."""
    out = tmp_path / "throttling.json"
    done = bench("throttling", "--nodes", "60", "--rate", "20", "--json", str(out), timeout=240)
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    baseline, throttled = figures["baseline"], figures["throttled"]
    assert baseline["most_writes_of_one_node"] == throttled["most_writes_of_one_node"] == 1
    assert baseline["answered_429"] == 0
    assert throttled["answered_429"] > 0
    assert throttled["ideal_s"] == 3.0
    assert "throttled / ideal" in done.stdout
