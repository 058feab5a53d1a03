"""bench/scenarios/connection_floor.py at 20 nodes: both shapes measured, every figure written, and
every process it started gone when it returns."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench_runs import bench


def test_the_connection_floor_measures_both_shapes_and_leaves_nothing_running(tmp_path: Path):
    """Pull (a client per node address) and push (a server taking a stream per agent) each
    report an idle and a loaded RSS and KiB a connection; the bench's children are gone."""
    out = tmp_path / "floor.json"
    done = bench(
        "connection_floor", "--nodes", "20", "--settle", "0.2", "--json", str(out), timeout=120
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert figures["nodes"] == 20
    for shape in ("pull", "push"):
        f = figures[shape]
        assert f["rss_mib"] > f["idle_rss_mib"] > 10
        assert f["kib_per_connection"] > 0
    assert "push / pull, KiB a connection" in done.stdout
    left = subprocess.run(
        ["pgrep", "-f", "bench[.]floors[.]"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert left.stdout == ""


def test_a_silent_child_fails_the_bench_at_its_deadline():
    """A child that never prints the line the bench waits for fails it once the deadline
    passes (it does not block the bench until the child exits)."""
    from bench.shared.children import expect

    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.PIPE, text=True
    )
    try:
        with pytest.raises(RuntimeError, match=r"the child: no 'ready' within 1 s"):
            expect(proc, "ready", 1.0, "the child")
    finally:
        proc.kill()
        proc.communicate(timeout=10)  # reaps it and closes its pipe
