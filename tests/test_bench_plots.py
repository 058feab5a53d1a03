"""bench/figures/plot.py draws a PNG per results file, and refuses a bad one in one line;
each scenario's --json file is one it draws. What each chart shows: test_bench_charts.py."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.figures.plot import main as plot_main
from bench.figures.results import (
    earlier_cluster_runs,
    held_runs,
    write_cluster_runs,
    write_json,
    write_kwok_runs,
)
from bench.scenarios.cycle import cycle_figures
from bench.shared.run import command
from tests.bench_runs import bench

ROOT = Path(__file__).resolve().parent.parent
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def fanout_point(subscribers: int, scale: float) -> dict[str, Any]:
    def kind(factor: float) -> dict[str, Any]:
        return {
            "p50": 2 * scale * factor,
            "p99": 9 * scale * factor,
            "max": 12 * scale * factor,
            "hand_off": 4 * scale * factor,
            "p99_rounds": [9 * scale * factor] * 2,
            "hand_off_rounds": [4 * scale * factor] * 2,
            "short": 0,
            "kib_per_subscriber": 27.5 if factor > 1 else 22.0,
        }

    return {
        "subscribers": subscribers,
        "channels": min(10, subscribers),
        "cycles": 20,
        "pace_s": 0.2,
        "rounds": 3,
        "capwatch": kind(1.1),
        "bare": kind(1.0),
        "p99_ratio": 1.1,
        "hand_off_ratio": 1.1,
        "p99_target": 1.2,
        "hand_off_target": 1.3,
    }


def kwok_run() -> dict[str, Any]:
    components = ("controller", "kube-apiserver", "etcd", "kwok", "kube-controller-manager")
    return {
        "source": "test",
        "nodes": 20,
        "subscribed_s": 3.0,
        "failing": 2,
        "detected": 2,
        "floor_rss_mib": 40.0,
        "steady": {
            f"heartbeat_{h}": {
                "cores": dict.fromkeys(components, 0.1),
                "rss_mib": dict.fromkeys(components, 100.0),
            }
            for h in (300, 60)
        },
    }


def cluster_run(shards: int) -> dict[str, Any]:
    return {
        "source": f"test, {shards} shard(s)",
        "shards": shards,
        "controllers": [
            {"shard": k, "nodes": 20 // shards, "cores": 0.1 / shards, "rss_mib": 100 / shards}
            for k in range(shards)
        ],
        "latency_ms": {
            "to_false": {"p50": 5, "p99": 40},
            "to_true": {"p50": 6, "p99": 500},
            "stream": {"p50": 0, "p99": 30},
        },
    }


FIXTURE: dict[str, dict[str, Any]] = {
    "cycle": {
        "source": "test",
        "kube_ms": [1.0 + i / 100 for i in range(50)],
        "floor_ms": [0.9 + i / 100 for i in range(50)],
    },
    "stream": {
        "source": "test",
        "throughput": {
            "msg_s": {"capwatch": [900, 950, 870], "bare": [1000, 990, 1020]},
            "ratio": 0.9,
            "target": 0.8,
        },
        "fanout": fanout_point(10, 1.0),
        "cycle": {
            "subscribers": 10,
            "ratios": {"frozen": [1.0, 1.05, 0.98], "never reading": [1.02, 1.1, 0.99]},
            "target": 1.1,
        },
    },
    "fanout": {
        "source": "test",
        "points": [fanout_point(n, n / 100) for n in (10, 100, 1000)],
    },
    "readyz": {
        "source": "test",
        "clients": 10,
        "load_generator": "test",
        "rounds": [
            {
                "shim": {"req_s": 100, "p50_ms": 1, "p99_ms": 3},
                "bare": {"req_s": 150, "p50_ms": 1, "p99_ms": 2},
            }
        ],
        "ratio_target": 0.5,
        "rss_mib": {"ready": 40, "warm": 42, "after": 43, "peak": 43},
        "rss_target_mib": 60,
    },
    "cluster": {"source": "test", "nodes": 20, "runs": [cluster_run(1), cluster_run(2)]},
    "fencing": {
        "source": "test",
        **{
            key: {
                "trials": 3,
                "admitted": admitted,
                "refused": 4,
                "left_after_deadline": 1,
                "applied_after_deadline": 0,
                "dropped": 5,
                "takeover_s": [4.2, 4.8, 5.1],
            }
            for key, admitted in (("with_policy", 0), ("without_policy", 7))
        },
        "window_ms": {"median": 9.7, "max": 14.7},
    },
    "kwok": {"source": "test", "nodes": 20, "runs": [kwok_run(), kwok_run()]},
}


def run_plot(results: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """``python -m bench.figures.plot``, as ``make bench-plots`` runs it."""
    return subprocess.run(
        [sys.executable, "-m", "bench.figures.plot", "--results", str(results), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def write_results(directory: Path, figures: dict[str, object]) -> None:
    directory.mkdir(exist_ok=True)
    for name, content in figures.items():
        (directory / f"{name}.json").write_text(json.dumps(content))


def assert_pngs(out: Path, names: list[str]) -> None:
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{name}.png" for name in names)
    for name in names:
        data = (out / f"{name}.png").read_bytes()
        assert data.startswith(PNG_SIGNATURE), name
        assert len(data) > 10_000, name  # more than an empty canvas


@pytest.mark.slow
def test_each_results_file_becomes_a_png(tmp_path: Path):
    """Small figures for every bench give one real PNG each (signature, and more than an
    empty canvas's bytes), named after its file."""
    write_results(tmp_path / "results", FIXTURE)
    done = run_plot(tmp_path / "results", tmp_path / "plots")
    assert done.returncode == 0, done.stderr
    assert_pngs(tmp_path / "plots", list(FIXTURE))


def _without(name: str, *keys: str | int) -> dict[str, Any]:
    figures = copy.deepcopy(FIXTURE[name])
    parent: Any = figures
    for key in keys[:-1]:
        parent = parent[key]
    del parent[keys[-1]]
    return figures


def _with(name: str, value: object, *keys: str | int) -> dict[str, Any]:
    figures = copy.deepcopy(FIXTURE[name])
    parent: Any = figures
    for key in keys[:-1]:
        parent = parent[key]
    parent[keys[-1]] = value
    return figures


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("cycle", {"floor_ms": [1.0]}, "cycle.json: no kube_ms"),
        ("cycle", {"kube_ms": ["1"], "floor_ms": [1.0]}, "kube_ms is not a list of numbers"),
        ("cycle", _without("cycle", "source"), "cycle.json: no source"),
        ("readyz", [1, 2], "readyz.json: not a JSON object"),
        ("readyz", _with("readyz", "fast", "rounds", 0, "shim", "req_s"), "rounds[0].shim.req_s"),
        ("readyz", _with("readyz", [], "rounds"), "readyz.json: rounds is not a non-empty list"),
        ("stream", {"source": "x"}, "stream.json: no throughput, fanout or cycle"),
        ("stream", _without("stream", "fanout", "capwatch", "p99"), "no fanout.capwatch.p99"),
        (
            "stream",
            _with("stream", [1.0], "throughput", "msg_s", "bare"),
            "capwatch and bare have different rounds",
        ),
        ("fanout", _without("fanout", "points", 1, "bare"), "fanout.json: no points[1].bare"),
        (
            "fanout",
            _with("fanout", 5, "points", 2, "subscribers"),
            "points: subscribers do not rise",
        ),
        ("cluster", _without("cluster", "runs", 1, "latency_ms"), "no runs[1].latency_ms"),
        ("kwok", _without("kwok", "runs", 1, "floor_rss_mib"), "no runs[1].floor_rss_mib"),
        ("kwok", _with("kwok", {}, "runs", 0, "steady"), "runs[0].steady is not an object"),
        (
            "crash",
            {},
            "crash.json: no chart for it "
            "(known: cycle, stream, fanout, readyz, cluster, fencing, kwok)",
        ),
    ],
)
def test_bad_results_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, content: object, message: str
):
    """A missing figure, a wrong type, a file that is not an object or has no chart: exit 2
    and one line naming the file and what is wrong, and no chart drawn."""
    write_results(tmp_path / "results", {name: content})
    status = plot_main(["--results", str(tmp_path / "results"), "--out", str(tmp_path / "plots")])
    assert status == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("plot: ")
    assert message in lines[0]
    assert not (tmp_path / "plots").exists()


def test_a_bad_file_replaces_no_chart(tmp_path: Path):
    """One bad file among good ones: exit 2 before any PNG is written, so the charts
    already there (of the good files' earlier figures) are kept as they were."""
    write_results(tmp_path / "results", {"cycle": FIXTURE["cycle"], "stream": {"source": "x"}})
    out = tmp_path / "plots"
    out.mkdir()
    (out / "cycle.png").write_bytes(b"earlier chart")
    done = run_plot(tmp_path / "results", out)
    assert done.returncode == 2
    assert "stream.json" in done.stderr
    assert (out / "cycle.png").read_bytes() == b"earlier chart"


def test_unparseable_json_and_no_results_are_one_line(tmp_path: Path):
    """JSON that does not parse names its file; an empty results folder says so (both as
    ``make bench-plots`` runs it: the module's own exit status and stderr)."""
    (tmp_path / "results").mkdir()
    done = run_plot(tmp_path / "results", tmp_path / "plots")
    assert done.returncode == 2
    assert done.stderr.strip() == f"plot: {tmp_path / 'results'}: no results (*.json)"
    (tmp_path / "results" / "cycle.json").write_text("{not json")
    done = run_plot(tmp_path / "results", tmp_path / "plots")
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1
    assert "cycle.json: Expecting property name" in done.stderr


def test_cycle_json_is_what_plot_reads(tmp_path: Path):
    """cycle.py's --json writer, on a few cycles' times, gives a file the charts draw, with
    the date, the machine and the command in its source."""
    results = tmp_path / "results"
    results.mkdir()
    write_json(results / "cycle.json", cycle_figures([1.1, 1.2, 1.3], [1.0, 1.05, 1.1]))
    source = json.loads((results / "cycle.json").read_text())["source"]
    assert "cores" in source
    assert "Python" in source
    assert source.endswith(f": {command()}")  # as this process was started, -m or not
    done = run_plot(results, tmp_path / "plots")
    assert done.returncode == 0, done.stderr
    assert_pngs(tmp_path / "plots", ["cycle"])


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_stream_and_fanout_json_are_what_plot_reads(tmp_path: Path):
    """stream.py's fan-out part and fanout.py's sweep, at their smallest (a few subscribers,
    two rounds of three cycles), write files the charts draw."""
    results = tmp_path / "results"
    results.mkdir()
    tiny = ("--fanout-rounds", "2", "--cycles", "3", "--pace", "0.05")
    done = bench(
        "stream", "--only", "fanout", "--subscribers", "4", *tiny,
        "--json", str(results / "stream.json"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    done = bench("fanout", "--subscribers", "2,4", *tiny, "--json", str(results / "fanout.json"))
    assert done.returncode == 0, done.stderr
    points = json.loads((results / "fanout.json").read_text())["points"]
    assert [p["subscribers"] for p in points] == [2, 4]
    assert all(p["capwatch"]["short"] == p["bare"]["short"] == 0 for p in points)
    done = run_plot(results, tmp_path / "plots")
    assert done.returncode == 0, done.stderr
    assert_pngs(tmp_path / "plots", ["fanout", "stream"])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_readyz_json_is_what_plot_reads(tmp_path: Path):
    """readyz.py at its smallest (4 clients, one round of a second: wrk takes whole seconds)
    writes every round's figures and the shim's memory in a file the charts draw."""
    results = tmp_path / "results"
    results.mkdir()
    done = bench(
        "readyz", "--clients", "4", "--seconds", "1", "--warmup", "1", "--rounds", "1",
        "--json", str(results / "readyz.json"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads((results / "readyz.json").read_text())
    assert len(figures["rounds"]) == 1
    assert figures["rounds"][0]["shim"]["req_s"] > 0
    done = run_plot(results, tmp_path / "plots")
    assert done.returncode == 0, done.stderr
    assert_pngs(tmp_path / "plots", ["readyz"])


def test_json_of_a_bad_place_is_refused_before_the_run(tmp_path: Path):
    """--json into a folder that does not exist stops at once, in one line, before any
    measuring."""
    done = bench("fanout", "--json", str(tmp_path / "missing" / "fanout.json"), timeout=30)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"--json {tmp_path / 'missing' / 'fanout.json'}: no such directory {tmp_path / 'missing'}"
    )


def test_cluster_json_keeps_the_other_shard_counts(tmp_path: Path):
    """A cluster run's figures replace the file's run with the same --shards and keep the
    others, and the file is one the charts draw; a file of another --nodes, or not a cluster
    file, is refused (one line) and left as it was."""
    path = tmp_path / "results" / "cluster.json"
    path.parent.mkdir()
    write_cluster_runs(path, 20, [cluster_run(1), cluster_run(2)])
    kept = earlier_cluster_runs(path, 20, 2, "shared")
    assert [r["shards"] for r in kept] == [1]
    write_cluster_runs(path, 20, [*kept, {**cluster_run(2), "source": "again"}])
    figures = json.loads(path.read_text())
    assert [(r["shards"], r["source"]) for r in figures["runs"]] == [
        (1, "test, 1 shard(s)"),
        (2, "again"),
    ]
    assert figures["source"] == (
        "1 shard(s), shared addresses: test, 1 shard(s); 2 shard(s), shared addresses: again"
    )
    done = run_plot(path.parent, tmp_path / "plots")
    assert done.returncode == 0, done.stderr
    assert_pngs(tmp_path / "plots", ["cluster"])
    before = path.read_text()
    with pytest.raises(SystemExit, match=r"holds 20-node runs, this one is 5000: another file"):
        earlier_cluster_runs(path, 5000, 1, "shared")
    assert path.read_text() == before
    path.write_text('{"nodes": 20}')
    with pytest.raises(SystemExit, match=r"not a cluster.py results file"):
        earlier_cluster_runs(path, 20, 1, "shared")
    path.write_text(before)
    assert earlier_cluster_runs(path, 20, 3, "shared") == json.loads(before)["runs"]


def test_cluster_json_keeps_both_shapes_of_one_shard_count(tmp_path: Path):
    """A run with an address per node and one with shared addresses, both with one shard,
    are both kept (the per-node run first), each replaced only by a run of its own shape,
    and the chart draws them side by side; a run without a shape counts as shared."""
    path = tmp_path / "results" / "cluster.json"
    path.parent.mkdir()
    old = cluster_run(1)  # from before the shapes: no "shape" key
    write_cluster_runs(path, 20, [old])
    kept = earlier_cluster_runs(path, 20, 1, "per_node")
    assert kept == [old]
    write_cluster_runs(path, 20, [*kept, {**cluster_run(1), "shape": "per_node", "source": "per"}])
    runs = json.loads(path.read_text())["runs"]
    assert [(r.get("shape"), r["source"]) for r in runs] == [
        ("per_node", "per"),
        (None, "test, 1 shard(s)"),
    ]
    assert [r["source"] for r in earlier_cluster_runs(path, 20, 1, "shared")] == ["per"]
    done = run_plot(path.parent, tmp_path / "plots")
    assert done.returncode == 0, done.stderr
    assert_pngs(tmp_path / "plots", ["cluster"])


def test_kwok_json_keeps_the_latest_two_runs(tmp_path: Path):
    """kwok.py --json adds its run to the file's and keeps the latest two, which the charts
    draw; a file of another --nodes, or not a kwok.py file, is refused in one line."""
    path = tmp_path / "results" / "kwok.json"
    path.parent.mkdir()
    assert held_runs(path, 20, "kwok.py") == []
    for name in ("a", "b", "c"):
        write_kwok_runs(path, [*held_runs(path, 20, "kwok.py"), {**kwok_run(), "source": name}])
    figures = json.loads(path.read_text())
    assert [r["source"] for r in figures["runs"]] == ["b", "c"]
    assert figures["source"] == "run 1: b; run 2: c"
    done = run_plot(path.parent, tmp_path / "plots")
    assert done.returncode == 0, done.stderr
    assert_pngs(tmp_path / "plots", ["kwok"])
    with pytest.raises(SystemExit, match=r"holds 20-node runs, this one is 5000: another file"):
        held_runs(path, 5000, "kwok.py")
    path.write_text('{"runs": []}')
    with pytest.raises(SystemExit, match=r"not a kwok.py results file"):
        held_runs(path, 20, "kwok.py")
