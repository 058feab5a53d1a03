"""What each chart of bench/figures shows, read back from the matplotlib figure it draws
(its bars, lines and labels) and from the PNG's metadata: the figures of a results file,
not a picture compared byte for byte."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from matplotlib.axes import Axes
from matplotlib.collections import PathCollection
from matplotlib.container import BarContainer
from matplotlib.figure import Figure
from PIL import Image

from bench.figures.plot import PLOTS, draw, plt
from tests.test_bench_plots import FIXTURE, cluster_run, write_results

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _closed() -> Iterator[None]:
    """Every figure a test draws is closed after it (pyplot keeps them otherwise)."""
    yield
    plt.close("all")


def chart(name: str, figures: dict[str, Any] | None = None) -> Figure:
    return PLOTS[name](FIXTURE[name] if figures is None else figures)


def bars(ax: Axes) -> dict[str, list[float]]:
    """Each bar series of ``ax`` by its legend label (a histogram's is its first bar's): its
    heights (or widths, lying down)."""
    out = {}
    for container in ax.containers:
        assert isinstance(container, BarContainer)
        across = container.orientation == "horizontal"
        label = container.get_label()
        out[container.patches[0].get_label() if label.startswith("_") else label] = [
            round(bar.get_width() if across else bar.get_height(), 6) for bar in container
        ]
    return out


def lines(ax: Axes) -> dict[str, tuple[list[float], list[float]]]:
    """Each labelled line of ``ax``: its x and y data."""
    return {
        line.get_label(): (
            [float(x) for x in line.get_xdata()],
            [float(y) for y in line.get_ydata()],
        )
        for line in ax.get_lines()
        if not line.get_label().startswith("_")
    }


def ticks(ax: Axes) -> list[str]:
    return [label.get_text() for label in ax.get_xticklabels()]


def test_the_cycle_chart_sets_both_distributions_beside_the_target() -> None:
    """Both kinds' cycles as histograms over 99.5% of the cycles (the slowest 0.5% of the
    two together left out), each median as a dashed line, the 2 ms target as a line, and
    both medians in the title; the source at the foot."""
    figures = {
        "source": "a test run",
        "kube_ms": [1.0 + i / 100 for i in range(101)],
        "floor_ms": [0.5 + i / 100 for i in range(101)],
    }
    fig = chart("cycle", figures)
    (ax,) = fig.axes
    counted = {label: sum(heights) for label, heights in bars(ax).items()}
    assert counted == {"in-memory pod view (floor)": 101, "Kubernetes list+watch view": 99}
    assert sorted(float(line.get_xdata()[0]) for line in ax.get_lines()) == [1.0, 1.5, 2.0]
    assert "target: median <= 2 ms" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert ax.get_title().endswith("101 cycles each (median dashed): 1.50 against 1.00 ms")
    assert [t.get_text() for t in fig.texts] == ["Measured: a test run"]


def test_the_stream_chart_draws_the_parts_measured_and_no_other() -> None:
    """The throughput rounds as paired bars with the median ratio judged against its
    target; a file of the fan-out part alone gets its two panels, not four."""
    fig = chart("stream")
    throughput, fanout, memory, cycle = fig.axes
    assert bars(throughput) == {"capwatch": [900, 950, 870], "bare grpc.aio": [1000, 990, 1020]}
    assert ticks(throughput) == ["1", "2", "3"]
    assert throughput.get_title().endswith("median ratio 0.90 (>= 0.8: met)")
    assert bars(fanout)["capwatch"] == pytest.approx([2.2, 9.9, 13.2, 4.4])
    assert "p99 ratio 1.10 (<= 1.2: met), hand-off 1.10 (<= 1.3: met)" in fanout.get_title()
    assert bars(memory) == {"capwatch": [27.5], "bare grpc.aio": [22.0]}
    assert cycle.get_title().startswith("cycle cost, 10 subscribers")
    alone = {"source": "test", "fanout": FIXTURE["stream"]["fanout"]}
    titles = [ax.get_title() for ax in chart("stream", alone).axes]
    assert [t.split(",")[0] for t in titles] == ["publish -> receive", "per idle subscriber"]


def test_the_fanout_chart_plots_each_kind_and_ratio_against_subscribers() -> None:
    """Latency p50/p99 and hand-off of each kind at each subscriber count, on log axes,
    and the ratios beside their targets."""
    fig = chart("fanout")
    latency, hand_off, ratios = fig.axes
    counts = [10.0, 100.0, 1000.0]
    drawn = lines(latency)
    assert drawn["capwatch Watch p99"] == (counts, pytest.approx([0.99, 9.9, 99.0]))
    assert drawn["bare p50"] == (counts, pytest.approx([0.2, 2.0, 20.0]))
    assert lines(hand_off)["bare"] == (counts, pytest.approx([0.4, 4.0, 40.0]))
    assert lines(ratios)["p99 ratio"] == (counts, [1.1, 1.1, 1.1])
    assert lines(ratios)["p99 target"][1] == [1.2, 1.2]
    assert (latency.get_xscale(), latency.get_yscale()) == ("log", "log")
    assert ticks(latency) == ["10", "100", "1,000"]


def test_the_readyz_chart_sets_each_round_against_its_target() -> None:
    """Answered requests/s of the shim and the bare handler by round, the shim's target
    (half the bare rate) over each round, latencies, and the shim's memory stages beside
    the memory target."""
    left, middle, right = chart("readyz").axes
    assert bars(left) == {"capwatch shim": [100], "bare asyncio handler": [150]}
    (round_target,) = left.collections
    assert [segment[0][1] for segment in round_target.get_segments()] == [75.0]
    assert left.get_title().endswith("shim / bare by round: 0.67")
    assert bars(middle) == {"capwatch shim": [1, 3], "bare asyncio handler": [1, 2]}
    assert list(bars(right).values()) == [[40, 42, 43, 43]]
    assert ticks(right) == ["ready", "after\nwarm-up", "after\nthe load", "peak"]
    assert lines(right)["target <= 60 MiB"][1] == [60, 60]


def test_the_cluster_chart_sets_each_shard_count_against_its_targets() -> None:
    """Detection latency (p50 and p99, a floor of 0.1 ms on the log axis) for each run, and
    the highest shard's CPU and RSS per run beside the targets; a file holding both address
    shapes names each run's shape."""
    left, cpu, rss = chart("cluster").axes
    latency = bars(left)
    assert latency["p50"] == [5, 5, 6, 6, 0.1, 0.1]
    assert latency["p99"] == [40, 40, 500, 500, 30, 30]
    assert bars(cpu)["highest shard"] == [0.1, 0.05]
    assert bars(rss)["highest shard"] == [100, 50]
    assert ticks(cpu) == ["1 shard(s)", "2 shard(s)"]
    assert lines(rss)["target <= 512 MiB"][1] == [512, 512]
    both = {
        "source": "test",
        "nodes": 20,
        "runs": [{**cluster_run(1), "shape": "per_node"}, cluster_run(1)],
    }
    assert ticks(chart("cluster", both).axes[1]) == [
        "1 shard(s)\naddress\nper node",
        "1 shard(s)\nshared\naddresses",
    ]


def test_the_kwok_chart_sets_every_component_by_run_and_heartbeat() -> None:
    """Each component's CPU and RSS for each run at each heartbeat (the longer first), the
    floor's RSS beside the controller's, and each run's detection in the title."""
    fig = chart("kwok")
    cpu, rss = fig.axes
    assert ticks(cpu) == [
        "run 1\nheartbeat 300 s",
        "run 1\nheartbeat 60 s",
        "run 2\nheartbeat 300 s",
        "run 2\nheartbeat 60 s",
    ]
    assert bars(cpu) == dict.fromkeys(
        ("controller", "kube-apiserver", "etcd", "kwok", "kube-controller-manager"), [0.1] * 4
    )
    assert set(bars(rss)["controller"]) == {100.0}
    (floor,) = [dots for dots in rss.collections if isinstance(dots, PathCollection)]
    assert [float(y) for _, y in floor.get_offsets()] == [40.0] * 4
    assert "run 1: 2/2 detected, subscribed in 3 s" in fig.get_suptitle()


def test_the_fencing_chart_sums_the_old_leaders_writes_with_and_without_the_policy() -> None:
    """The old leader's writes in each count, with the policy and without, and each
    trial's takeover, the policy's window in the title."""
    writes, takeover = chart("fencing").axes
    assert bars(writes) == {"with the policy": [0, 4, 1, 0, 5], "without": [7, 4, 1, 0, 5]}
    trials = [
        [float(y) for _, y in dots.get_offsets()]
        for dots in takeover.collections
        if isinstance(dots, PathCollection)
    ]
    assert trials == [[4.2, 4.8, 5.1], [4.2, 4.8, 5.1]]
    assert takeover.get_title().endswith("median / max: 9.7 / 14.7 ms")


def test_each_png_carries_its_chart_title_and_the_figures_source(tmp_path: Path) -> None:
    """Every PNG drawn says in its metadata what it shows (the chart's title) and where
    its figures come from (the results file's source), and not which matplotlib drew it."""
    write_results(tmp_path / "results", FIXTURE)
    written = draw(tmp_path / "results", tmp_path / "plots")
    assert sorted(p.stem for p in written) == sorted(FIXTURE)
    titles = {}
    for path in written:
        with Image.open(path) as png:
            text = dict(png.text)
        assert text.keys() == {"Title", "Source"}, path
        assert text["Source"] == "test", path
        titles[path.stem] = text["Title"]
    assert titles["cycle"].startswith("One reconcile cycle: 8 GPUs, 110 pods, 50 cycles each")
    assert titles["kwok"].startswith("20 KWOK nodes, an address per node")
    assert titles["fencing"] == (
        "A leader frozen mid-burst on the real API server (bench/scenarios/fencing.py)"
    )


@pytest.mark.slow
def test_the_committed_results_are_ones_the_charts_draw(tmp_path: Path) -> None:
    """Every committed results file is one the charts draw today, into a PNG naming that
    file's source (a results file the charts no longer read fails here, not at the next
    ``make bench-plots``)."""
    results = ROOT / "bench" / "results"
    written = draw(results, tmp_path)
    assert sorted(p.stem for p in written) == sorted(PLOTS)
    for path in written:
        source = json.loads((results / f"{path.stem}.json").read_text())["source"]
        with Image.open(path) as png:
            assert png.text["Source"] == source
