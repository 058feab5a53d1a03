"""bench/plot.py draws a PNG per results file, and refuses a bad one in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLOT = ROOT / "bench" / "plot.py"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

FIXTURE = {
    "cycle": {
        "source": "test",
        "kube_ms": [1.0 + i / 100 for i in range(50)],
        "floor_ms": [0.9 + i / 100 for i in range(50)],
    },
    "stream": {
        "source": "test",
        "fanout": {
            "subscribers": 10,
            "latency_ms": {"A": {"capwatch": {"p50": 3, "p99": 9}, "bare": {"p50": 2, "p99": 8}}},
            "handoff_ms": {"A": {"capwatch": 4, "bare": 3}},
        },
        "throughput_msg_s": {"A": {"capwatch": 900, "bare": 1000}},
    },
    "readyz": {
        "source": "test",
        "clients": 10,
        "shim": {"req_s": [100], "p50_ms": [1, 2], "p99_ms": [3, 4]},
        "bare": {"req_s": [150], "p50_ms": [1, 1], "p99_ms": [2, 3]},
    },
    "cluster": {
        "source": "test",
        "nodes": 20,
        "latency_ms": {"failed -> False": [{"p50": 5, "p99": 40}]},
        "shards": {
            "1": {"cores": [0.1], "rss_mib": [100]},
            "2": {"cores": [0.05], "rss_mib": [60]},
        },
    },
}


def run_plot(results: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PLOT), "--results", str(results), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def write_results(directory: Path, figures: dict[str, object]) -> None:
    directory.mkdir()
    for name, content in figures.items():
        (directory / f"{name}.json").write_text(json.dumps(content))


@pytest.mark.slow
def test_each_results_file_becomes_a_png(tmp_path: Path):
    """Small figures for every bench give one real PNG each (signature, and more than an
    empty canvas's bytes), named after its file."""
    write_results(tmp_path / "results", FIXTURE)
    done = run_plot(tmp_path / "results", tmp_path / "plots")
    assert done.returncode == 0, done.stderr
    written = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert written == sorted(f"{name}.png" for name in FIXTURE)
    for name in FIXTURE:
        data = (tmp_path / "plots" / f"{name}.png").read_bytes()
        assert data.startswith(PNG_SIGNATURE), name
        assert len(data) > 10_000, name


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("cycle", {"floor_ms": [1.0]}, "cycle.json: no kube_ms"),
        ("cycle", {"kube_ms": ["1"], "floor_ms": [1.0]}, "kube_ms is not a list of numbers"),
        ("readyz", [1, 2], "readyz.json: not a JSON object"),
        ("crash", {}, "crash.json: no chart for it (known: cycle, stream, readyz, cluster)"),
    ],
)
def test_bad_results_are_refused_in_one_line(
    tmp_path: Path, name: str, content: object, message: str
):
    """A missing figure, a wrong type, a file that is not an object or has no chart: exit 2
    and one line naming the file and what is wrong."""
    write_results(tmp_path / "results", {name: content})
    done = run_plot(tmp_path / "results", tmp_path / "plots")
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("plot.py: ")
    assert message in lines[0]


def test_unparseable_json_and_no_results_are_one_line(tmp_path: Path):
    """JSON that does not parse names its file; an empty results folder says so."""
    (tmp_path / "results").mkdir()
    done = run_plot(tmp_path / "results", tmp_path / "plots")
    assert done.returncode == 2
    assert done.stderr.strip() == f"plot.py: {tmp_path / 'results'}: no results (*.json)"
    (tmp_path / "results" / "cycle.json").write_text("{not json")
    done = run_plot(tmp_path / "results", tmp_path / "plots")
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1
    assert "cycle.json: Expecting property name" in done.stderr


def test_committed_plots_are_the_committed_results():
    """Every committed results file has its committed PNG beside the README that links it."""
    results = sorted(p.stem for p in (ROOT / "bench" / "results").glob("*.json"))
    assert results == ["cluster", "cycle", "readyz", "stream"]
    readme = (ROOT / "bench" / "README.md").read_text()
    for name in results:
        assert (ROOT / "bench" / "plots" / f"{name}.png").read_bytes().startswith(PNG_SIGNATURE)
        assert f"(plots/{name}.png)" in readme, name
