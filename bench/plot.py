"""Charts of the benchmark figures: PNGs in bench/plots/ from bench/results/*.json.

``cycle.json`` is written by ``bench/cycle.py --json`` (every cycle's time);
``stream.json``, ``readyz.json`` and ``cluster.json`` hold the figures
bench/README.md records for those benches (they print theirs for reading).
Each file present is drawn; a file missing a figure stops with one line.

    python bench/plot.py [--results DIR] [--out DIR]     # make bench-plots
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib as mpl

mpl.use("Agg")  # files only: no display, the same output everywhere

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

HERE = Path(__file__).resolve().parent
CAPWATCH, BARE = "tab:blue", "tab:gray"


class BadFigures(Exception):
    """A results file that cannot be drawn: its message is the one line printed."""


def _get(figures: dict[str, Any], *keys: str) -> Any:
    found: Any = figures
    for key in keys:
        if not isinstance(found, dict) or key not in found:
            raise BadFigures(f"no {'.'.join(keys)}")
        found = found[key]
    return found


def _numbers(value: Any, what: str) -> list[float]:
    if not isinstance(value, list) or not value:
        raise BadFigures(f"{what} is not a list of numbers")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
        raise BadFigures(f"{what} is not a list of numbers")
    return [float(v) for v in value]


def _footer(fig: Figure, figures: dict[str, Any]) -> None:
    fig.text(0.01, 0.01, str(figures.get("source", "")), fontsize=7, color="dimgray")


def cycle(figures: dict[str, Any]) -> Figure:
    """The distribution of one reconcile cycle's time, list+watch view against the floor."""
    kube = _numbers(_get(figures, "kube_ms"), "kube_ms")
    floor = _numbers(_get(figures, "floor_ms"), "floor_ms")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    top = sorted(kube + floor)[int(0.995 * (len(kube) + len(floor) - 1))]
    bins = [top * i / 60 for i in range(61)]
    ax.hist(floor, bins=bins, alpha=0.6, color=BARE, label="in-memory pod view (floor)")
    ax.hist(kube, bins=bins, alpha=0.6, color=CAPWATCH, label="Kubernetes list+watch view")
    for data, color in ((kube, CAPWATCH), (floor, BARE)):
        ordered = sorted(data)
        median = ordered[len(ordered) // 2]
        ax.axvline(median, color=color, linestyle="--", linewidth=1)
    ax.axvline(2.0, color="tab:red", linewidth=1, label="target: median <= 2 ms")
    ax.set_xlabel("cycle time (ms), 99.5% of cycles shown")
    ax.set_ylabel("cycles")
    ax.set_title(f"One reconcile cycle: 8 GPUs, 110 pods, {len(kube)} cycles each (median dashed)")
    ax.legend()
    figures.setdefault("source", "")
    figures["source"] = (
        f"{figures['source']}, {figures.get('date', '')}, {figures.get('machine', '')}"
    )
    _footer(fig, figures)
    return fig


def _paired_bars(ax: Axes, groups: list[str], ours: list[float], bare: list[float]) -> None:
    width = 0.38
    xs = range(len(groups))
    ax.bar([x - width / 2 for x in xs], ours, width, color=CAPWATCH, label="capwatch")
    ax.bar([x + width / 2 for x in xs], bare, width, color=BARE, label="bare grpc.aio / asyncio")
    ax.set_xticks(list(xs), groups)
    ax.set_ylim(0, max(ours + bare) * 1.3)  # headroom for the legend and the labels
    for x, (a, b) in enumerate(zip(ours, bare, strict=True)):
        ax.text(x - width / 2, a, f"{a:g}", ha="center", va="bottom", fontsize=8)
        ax.text(x + width / 2, b, f"{b:g}", ha="center", va="bottom", fontsize=8)


def stream(figures: dict[str, Any]) -> Figure:
    """Fan-out latency and hand-off at 1,000 subscribers, and one client's throughput."""
    latency = _get(figures, "fanout", "latency_ms")
    handoff = _get(figures, "fanout", "handoff_ms")
    throughput = _get(figures, "throughput_msg_s")
    runs = sorted(latency)
    subscribers = _get(figures, "fanout", "subscribers")
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(13, 4.5))
    groups = [f"{run} {q}" for run in runs for q in ("p50", "p99")]
    ours = [float(_get(latency, run, "capwatch", q)) for run in runs for q in ("p50", "p99")]
    bare = [float(_get(latency, run, "bare", q)) for run in runs for q in ("p50", "p99")]
    _paired_bars(left, groups, ours, bare)
    left.set_title(f"publish -> receive, {subscribers:,} subscribers")
    left.set_ylabel("ms")
    left.legend(loc="upper left")
    ours = [float(_get(handoff, run, "capwatch")) for run in runs]
    bare = [float(_get(handoff, run, "bare")) for run in runs]
    _paired_bars(middle, [f"run {run}" for run in runs], ours, bare)
    middle.set_title(f"hand one cycle to all {subscribers:,} streams")
    middle.set_ylabel("ms")
    ours = [float(_get(throughput, run, "capwatch")) for run in runs]
    bare = [float(_get(throughput, run, "bare")) for run in runs]
    _paired_bars(right, [f"run {run}" for run in runs], ours, bare)
    right.set_title("Watch throughput, one client")
    right.set_ylabel("messages/s")
    fig.suptitle("capwatch.v1 Watch stream against a bare grpc.aio server")
    _footer(fig, figures)
    return fig


def readyz(figures: dict[str, Any]) -> Figure:
    """GET /readyz under 100 clients: the shim against a bare asyncio handler."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    names = ("shim", "bare")
    rates = [_numbers(_get(figures, name, "req_s"), f"{name}.req_s") for name in names]
    runs = [f"run {i + 1}" for i in range(len(rates[0]))]
    _paired_bars(left, runs, rates[0], rates[1])
    left.set_title(f"answered req/s, {figures.get('clients', '?')} clients")
    left.set_ylabel("requests/s")
    left.legend(["capwatch shim", "bare asyncio handler"], loc="upper left")
    for offset, name, color in ((-0.19, "shim", CAPWATCH), (0.19, "bare", BARE)):
        for x, q in enumerate(("p50_ms", "p99_ms")):
            low, high = _numbers(_get(figures, name, q), f"{name}.{q}")[:2]
            middle = (low + high) / 2
            right.bar(x + offset, middle, 0.38, color=color, yerr=[[middle - low], [high - middle]])
    right.set_xticks([0, 1], ["p50", "p99"])
    right.set_title("latency (range over the runs)")
    right.set_ylabel("ms")
    fig.suptitle("Readiness shim: GET /readyz, a connection per request")
    _footer(fig, figures)
    return fig


def cluster(figures: dict[str, Any]) -> Figure:
    """The simulated 5,000-node cluster: detection latency, and cost against shards."""
    latency = _get(figures, "latency_ms")
    shards = _get(figures, "shards")
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    labels, p50, p99 = [], [], []
    for kind, runs in latency.items():
        for i, run in enumerate(runs):
            labels.append(f"{kind}\nrun {i + 1}")
            p50.append(float(_get(run, "p50")))
            p99.append(float(_get(run, "p99")))
    ys = range(len(labels))
    left.barh([y + 0.2 for y in ys], p50, 0.4, color="tab:green", label="p50")
    left.barh([y - 0.2 for y in ys], p99, 0.4, color="tab:orange", label="p99")
    left.axvline(2000, color="tab:red", linewidth=1, label="target p99 <= 2 s (PATCH False)")
    left.set_xscale("log")
    left.set_yticks(list(ys), labels, fontsize=7)
    left.set_xlabel("ms (log)")
    left.set_title(f"from an agent cycle's end, {figures.get('nodes', '?'):,} nodes")
    left.legend(fontsize=8)
    counts = sorted(shards, key=int)
    cores = [_numbers(_get(shards, n, "cores"), f"shards.{n}.cores") for n in counts]
    rss = [_numbers(_get(shards, n, "rss_mib"), f"shards.{n}.rss_mib") for n in counts]
    xs = [int(n) for n in counts]
    right.plot(xs, [max(c) for c in cores], marker="o", color=CAPWATCH, label="CPU, cores")
    right.set_xlabel("shards")
    right.set_xticks(xs)
    right.set_ylabel("cores per controller", color=CAPWATCH)
    right.set_ylim(0, max(max(c) for c in cores) * 1.2)
    twin = right.twinx()
    twin.plot(xs, [max(r) for r in rss], marker="s", color="tab:purple", label="RSS, MiB")
    twin.set_ylabel("MiB per controller", color="tab:purple")
    twin.set_ylim(0, max(max(r) for r in rss) * 1.5)  # apart from the CPU line
    right.legend(handles=[*right.get_lines(), *twin.get_lines()], loc="upper right")
    right.set_title("one controller's cost, steady state (highest run)")
    fig.suptitle("capwatch controller following a simulated cluster")
    _footer(fig, figures)
    return fig


PLOTS: dict[str, Callable[[dict[str, Any]], Figure]] = {
    "cycle": cycle,
    "stream": stream,
    "readyz": readyz,
    "cluster": cluster,
}


def draw(results: Path, out: Path) -> list[Path]:
    """A PNG in ``out`` for each results file; BadFigures names the file at fault."""
    found = sorted(results.glob("*.json"))
    if not found:
        raise BadFigures(f"{results}: no results (*.json)")
    written = []
    out.mkdir(parents=True, exist_ok=True)
    for path in found:
        plot = PLOTS.get(path.stem)
        if plot is None:
            raise BadFigures(f"{path}: no chart for it (known: {', '.join(PLOTS)})")
        try:
            figures = json.loads(path.read_text())
            if not isinstance(figures, dict):
                raise BadFigures("not a JSON object")
            fig = plot(figures)
        except (OSError, ValueError, BadFigures) as exc:
            raise BadFigures(f"{path}: {exc}") from exc
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        target = out / f"{path.stem}.png"
        fig.savefig(target, dpi=100, metadata={"Software": None})
        plt.close(fig)
        written.append(target)
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--out", type=Path, default=HERE / "plots")
    args = parser.parse_args()
    try:
        written = draw(args.results, args.out)
    except BadFigures as exc:
        print(f"plot.py: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
