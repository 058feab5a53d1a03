"""bench/throttling.py at 60 nodes: the real condition writer against the fake API server
throttled to 20 status writes a second writes every node exactly once, is answered 429
meanwhile, and writes every figure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_throttled_writer_writes_each_node_once_and_reports_every_figure(
    tmp_path: Path,
) -> None:
    """Throttled to 20 writes a second, 60 failing nodes are each written once (none
    twice while another waits), some writes are answered 429, and the baseline run
    without a throttle sees none; both runs' figures are in the JSON."""
    out = tmp_path / "throttling.json"
    argv = ["bench/throttling.py", "--nodes", "60", "--rate", "20", "--json", str(out)]
    done = subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    baseline, throttled = figures["baseline"], figures["throttled"]
    assert baseline["most_writes_of_one_node"] == throttled["most_writes_of_one_node"] == 1
    assert baseline["answered_429"] == 0
    assert throttled["answered_429"] > 0
    assert throttled["ideal_s"] == 3.0
    assert "throttled / ideal" in done.stdout
