"""Charts of the benchmark figures: PNGs in bench/plots/ from bench/results/*.json.

Each file is written by its bench's ``--json FILE`` (bench/figures.py: a JSON
object whose ``source`` says the date, the machine and the command) and drawn
into a PNG of the same name. A file missing a figure, or holding the wrong
type, stops with one line naming the file and the figure; nothing is drawn
from a figure the bench did not measure. The shapes (``[]`` a list, one entry
per round; ``{p}``: ``{"p50", "p99"}`` in ms):

- ``cycle.json`` (bench/cycle.py): ``kube_ms`` and ``floor_ms``, every
  cycle's time with the list+watch pod view and with the in-memory one.
- ``stream.json`` (bench/stream.py): ``throughput``: ``msg_s.capwatch[]``,
  ``msg_s.bare[]``, ``ratio``, ``target``; ``fanout``: ``subscribers``,
  ``rounds``, ``capwatch`` and ``bare`` each with ``p50``, ``p99``, ``max``,
  ``hand_off`` (ms, medians of the rounds) and ``kib_per_subscriber``, then
  ``p99_ratio``, ``hand_off_ratio``, ``p99_target``, ``hand_off_target``;
  ``cycle``: ``subscribers``, ``ratios.frozen[]``, ``ratios["never reading"][]``,
  ``target``. A part run alone (``--only``) leaves the others out, and the
  chart draws what is there.
- ``fanout.json`` (bench/fanout.py): ``points[]``, each a ``fanout`` object as
  in stream.json, at rising ``subscribers``.
- ``readyz.json`` (bench/readyz.py): ``clients``, ``rounds[]`` each
  ``{"shim": L, "bare": L}`` with L ``{"req_s", "p50_ms", "p99_ms"}``,
  ``ratio_target``, ``rss_mib`` (``ready``, ``warm``, ``after``, ``peak``),
  ``rss_target_mib``.
- ``cluster.json`` (bench/cluster.py): ``nodes``, ``runs[]`` one per shard
  count, each with ``shards``, ``controllers[]`` (``cores``, ``rss_mib``) and
  ``latency_ms``: ``to_false`` {p}, ``to_true`` {p}, ``stream`` {p}.
- ``kwok.json`` (bench/kwok.py): ``nodes``, ``runs[]`` (the latest two), each with
  ``subscribed_s``, ``failing``, ``detected``, ``floor_rss_mib`` and ``steady``: per
  heartbeat (``heartbeat_300``, ``heartbeat_60``) ``cores`` and ``rss_mib`` by
  component (``controller``, ``kube-apiserver``, ``etcd``, ``kwok``,
  ``kube-controller-manager``).
- ``cluster.json`` runs may carry ``shape`` (``per_node`` or ``shared``; none: shared).
- ``fencing.json`` (bench/fencing.py): ``with_policy`` and ``without_policy``,
  each with ``trials``, ``admitted``, ``refused``, ``left_after_deadline``,
  ``applied_after_deadline``, ``dropped`` and ``takeover_s[]`` (one per
  trial); ``window_ms``: ``median``, ``max``.

    python bench/plot.py [--results DIR] [--out DIR]     # make bench-plots
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib as mpl

mpl.use("Agg")  # files only: no display, the same output everywhere

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from plot_kwok import kwok
from plot_style import BARE, CAPWATCH, PLAIN, SPARSE, TARGET
from plot_style import footer as _footer
from plot_style import target as _target
from plot_values import BadFigures, get, listed, number, numbers

HERE = Path(__file__).resolve().parent


def cycle(figures: dict[str, Any]) -> Figure:
    """The distribution of one reconcile cycle's time, list+watch view against the floor."""
    kube = numbers(figures, "kube_ms")
    floor = numbers(figures, "floor_ms")
    fig, ax = plt.subplots(figsize=(9, 5))
    ordered = sorted(kube + floor)
    low, top = ordered[0], ordered[int(0.995 * (len(ordered) - 1))]
    bins = [low + (top - low) * i / 60 for i in range(61)]
    ax.hist(floor, bins=bins, alpha=0.6, color=BARE, label="in-memory pod view (floor)")
    ax.hist(kube, bins=bins, alpha=0.6, color=CAPWATCH, label="Kubernetes list+watch view")
    for data, color in ((kube, CAPWATCH), (floor, BARE)):
        ax.axvline(statistics.median(data), color=color, linestyle="--", linewidth=1)
    ax.axvline(2.0, color=TARGET, linewidth=1, label="target: median <= 2 ms")
    ax.set_xlim(low - 0.05 * (top - low), max(top, 2.0) + 0.05 * (top - low))
    ax.set_xlabel("cycle time (ms), 99.5% of cycles shown")
    ax.set_ylabel("cycles")
    ax.set_title(
        f"One reconcile cycle: 8 GPUs, 110 pods, {len(kube):,} cycles each (median dashed): "
        f"{statistics.median(kube):.2f} against {statistics.median(floor):.2f} ms"
    )
    ax.legend(loc="upper right")
    _footer(fig, figures)
    return fig


def _paired_bars(
    ax: Axes,
    groups: list[str],
    ours: list[float],
    bare: list[float],
    labels: tuple[str, str] = ("capwatch", "bare grpc.aio"),
) -> None:
    width = 0.38
    xs = range(len(groups))
    ax.bar([x - width / 2 for x in xs], ours, width, color=CAPWATCH, label=labels[0])
    ax.bar([x + width / 2 for x in xs], bare, width, color=BARE, label=labels[1])
    ax.set_xticks(list(xs), groups)
    ax.set_ylim(0, max(ours + bare) * 1.35)  # headroom for the legend and the labels
    if len(groups) > 4:  # too many to label readably: the axis says
        return
    for x, (a, b) in enumerate(zip(ours, bare, strict=True)):
        ax.text(x - width / 2, a, _short(a), ha="center", va="bottom", fontsize=7)
        ax.text(x + width / 2, b, _short(b), ha="center", va="bottom", fontsize=7)


def _short(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _verdict(ratio: float, target: float, *, at_least: bool) -> str:
    met = ratio >= target if at_least else ratio <= target
    return f"{ratio:.2f} ({'>=' if at_least else '<='} {target:g}: {'met' if met else 'MISSED'})"


def _throughput(ax: Axes, f: dict[str, Any], key: str) -> None:
    ours = numbers(f, key, "msg_s", "capwatch")
    bare = numbers(f, key, "msg_s", "bare")
    if len(ours) != len(bare):
        raise BadFigures(f"{key}.msg_s: capwatch and bare have different rounds")
    _paired_bars(ax, [str(i + 1) for i in range(len(ours))], ours, bare)
    ratio, target = number(f, key, "ratio"), number(f, key, "target")
    ax.set_title(
        f"Watch throughput, one client\nmedian ratio {_verdict(ratio, target, at_least=True)}"
    )
    ax.set_xlabel("round (alternated)")
    ax.set_ylabel("cycle messages/s")
    ax.legend(loc="upper left", fontsize=8)


def _fanout_bars(ax: Axes, f: dict[str, Any], key: str) -> None:
    keys = ("p50", "p99", "max", "hand_off")
    ours = [number(f, key, "capwatch", k) for k in keys]
    bare = [number(f, key, "bare", k) for k in keys]
    _paired_bars(ax, ["p50", "p99", "max", "hand-off"], ours, bare)
    p99 = _verdict(number(f, key, "p99_ratio"), number(f, key, "p99_target"), at_least=False)
    hand = _verdict(
        number(f, key, "hand_off_ratio"), number(f, key, "hand_off_target"), at_least=False
    )
    ax.set_title(
        f"publish -> receive, {int(number(f, key, 'subscribers')):,} subscribers "
        f"(median of {int(number(f, key, 'rounds'))} rounds)\np99 ratio {p99}, hand-off {hand}",
        fontsize=10,
    )
    ax.set_ylabel("ms")
    ax.legend(loc="upper left", fontsize=8)


def _cycle_cost(ax: Axes, f: dict[str, Any], key: str) -> None:
    ratios = get(f, key, "ratios")
    if not isinstance(ratios, dict) or not ratios:
        raise BadFigures(f"{key}.ratios is not an object of rounds")
    for x, kind in enumerate(ratios):
        values = numbers(f, key, "ratios", kind)
        ax.scatter([x] * len(values), values, color=CAPWATCH, zorder=3)
        median = statistics.median(values)
        ax.hlines(median, x - 0.25, x + 0.25, color=CAPWATCH, linewidth=2)
        ax.text(x + 0.28, median, f"median {median:.2f}", va="center", fontsize=8)
    target = number(f, key, "target")
    _target(ax, target, f"target <= {target:g}")
    ax.axhline(1.0, color=BARE, linewidth=0.8)
    ax.set_xticks(range(len(ratios)), [str(k) for k in ratios])
    ax.set_xlim(-0.6, len(ratios) - 0.1)
    ax.set_ylabel("cycle until published: with / without")
    ax.set_title(
        f"cycle cost, {int(number(f, key, 'subscribers')):,} subscribers that never read\n"
        "(a dot per round)",
        fontsize=10,
    )
    ax.legend(loc="upper right", fontsize=8)


def _memory(ax: Axes, f: dict[str, Any], key: str) -> None:
    ours = number(f, key, "capwatch", "kib_per_subscriber")
    bare = number(f, key, "bare", "kib_per_subscriber")
    _paired_bars(ax, ["server RSS"], [ours], [bare])
    ax.set_title(
        f"per idle subscriber, {int(number(f, key, 'subscribers')):,} of them", fontsize=10
    )
    ax.set_ylabel("KiB per subscriber")
    ax.legend(loc="upper left", fontsize=8)


def stream(figures: dict[str, Any]) -> Figure:
    """Throughput rounds, fan-out at the bench's subscriber count, memory and cycle cost."""
    parts: list[tuple[Callable[[Axes, dict[str, Any], str], None], str]] = [
        (_throughput, "throughput"),
        (_fanout_bars, "fanout"),
        (_memory, "fanout"),
        (_cycle_cost, "cycle"),
    ]
    present = [(draw, key) for draw, key in parts if key in figures]
    if not present:
        raise BadFigures("no throughput, fanout or cycle")
    fig, axes = plt.subplots(1, len(present), figsize=(4.6 * len(present), 5.2), squeeze=False)
    for ax, (draw, key) in zip(axes[0], present, strict=True):
        draw(ax, figures, key)
    fig.suptitle("capwatch.v1 Watch stream against a bare grpc.aio server (same run)")
    _footer(fig, figures)
    return fig


def fanout(figures: dict[str, Any]) -> Figure:
    """Fan-out latency (p50, p99) and hand-off against the number of subscribers."""
    points = listed(figures, "points")
    xs = [number(figures, "points", i, "subscribers") for i in range(len(points))]
    if xs != sorted(set(xs)):
        raise BadFigures("points: subscribers do not rise")

    def series(kind: str, key: str) -> list[float]:
        return [number(figures, "points", i, kind, key) for i in range(len(points))]

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 5.2))
    for kind, color, name in (("capwatch", CAPWATCH, "capwatch Watch"), ("bare", BARE, "bare")):
        left.plot(xs, series(kind, "p99"), marker="o", color=color, label=f"{name} p99")
        left.plot(
            xs, series(kind, "p50"), marker="s", color=color, linestyle=":", label=f"{name} p50"
        )
        middle.plot(xs, series(kind, "hand_off"), marker="o", color=color, label=name)
    for ax in (left, middle, right):
        ax.set_xscale("log")
        ax.set_xticks(xs, [f"{int(x):,}" for x in xs])
        ax.minorticks_off()
        ax.set_xlabel("subscribers (log)")
    for ax in (left, middle):
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(PLAIN)
        ax.yaxis.set_minor_formatter(SPARSE)
    left.set_ylabel("publish -> receive, ms (log)")
    left.set_title("latency over every delivery")
    left.legend(fontsize=8)
    middle.set_ylabel("ms (log)")
    middle.set_title("hand-off: one cycle handed to every stream")
    middle.legend(fontsize=8)
    for key, marker, name in (("p99_ratio", "o", "p99"), ("hand_off_ratio", "s", "hand-off")):
        ratios = [number(figures, "points", i, key) for i in range(len(points))]
        right.plot(xs, ratios, marker=marker, label=f"{name} ratio")
    p99_target = number(figures, "points", 0, "p99_target")
    hand_target = number(figures, "points", 0, "hand_off_target")
    right.axhline(p99_target, color=TARGET, linestyle="--", linewidth=1, label="p99 target")
    right.axhline(hand_target, color=TARGET, linestyle=":", linewidth=1, label="hand-off target")
    right.axhline(1.0, color=BARE, linewidth=0.8)
    right.set_ylim(0, max(2.0, right.get_ylim()[1]))
    right.set_ylabel("capwatch / bare, median of the rounds' ratios")
    right.set_title("ratio to the bare broadcast (targets at 1,000)")
    right.legend(fontsize=8, loc="upper left")
    rounds = int(number(figures, "points", 0, "rounds"))
    pace = number(figures, "points", 0, "pace_s")
    fig.suptitle(
        f"Watch fan-out against subscribers: a cycle every {pace * 1000:.0f} ms, "
        f"medians of {rounds} alternated rounds, against a bare grpc.aio broadcast"
    )
    _footer(fig, figures)
    return fig


def readyz(figures: dict[str, Any]) -> Figure:
    """GET /readyz under load, every round: the shim against a bare asyncio handler."""
    rounds = listed(figures, "rounds")
    names = [f"round {i + 1}" for i in range(len(rounds))]

    def series(who: str, key: str) -> list[float]:
        return [number(figures, "rounds", i, who, key) for i in range(len(rounds))]

    labels = ("capwatch shim", "bare asyncio handler")
    fig, (left, middle, right) = plt.subplots(
        1, 3, figsize=(15, 5), gridspec_kw={"width_ratios": [2, 2, 1.2]}
    )
    shim, bare = series("shim", "req_s"), series("bare", "req_s")
    _paired_bars(left, names, shim, bare, labels)
    ratio_target = number(figures, "ratio_target")
    for x, b in enumerate(bare):  # where the shim must reach in that round
        left.hlines(b * ratio_target, x - 0.4, x + 0.4, color=TARGET, linestyle="--", linewidth=1)
    left.plot([], [], color=TARGET, linestyle="--", label=f"target: {ratio_target:g} x bare")
    ratios = ", ".join(f"{s / b:.2f}" for s, b in zip(shim, bare, strict=True))
    left.set_title(
        f"answered requests/s, {int(number(figures, 'clients'))} clients\n"
        f"shim / bare by round: {ratios}",
        fontsize=10,
    )
    left.set_ylabel("requests/s")
    left.legend(loc="upper left", fontsize=8)
    groups = [f"{q}\n{name}" for name in names for q in ("p50", "p99")]
    ours, theirs = [], []
    for i in range(len(rounds)):
        for q in ("p50_ms", "p99_ms"):
            ours.append(number(figures, "rounds", i, "shim", q))
            theirs.append(number(figures, "rounds", i, "bare", q))
    _paired_bars(middle, groups, ours, theirs, labels)
    middle.set_title("latency, request written -> answer read", fontsize=10)
    middle.set_ylabel("ms")
    middle.legend(loc="upper left", fontsize=8)
    stages = ("ready", "warm", "after", "peak")
    rss = [number(figures, "rss_mib", s) for s in stages]
    right.bar(range(len(stages)), rss, color=CAPWATCH)
    for x, v in enumerate(rss):
        right.text(x, v, f"{v:.1f}", ha="center", va="bottom", fontsize=7)
    rss_target = number(figures, "rss_target_mib")
    _target(right, rss_target, f"target <= {rss_target:g} MiB")
    right.set_xticks(range(len(stages)), ["ready", "after\nwarm-up", "after\nthe load", "peak"])
    right.set_ylim(0, max([*rss, rss_target]) * 1.25)
    right.set_ylabel("MiB")
    right.set_title("shim resident memory", fontsize=10)
    right.legend(loc="upper left", fontsize=8)
    generator = figures.get("load_generator", "")
    fig.suptitle(f"Readiness shim: GET /readyz, a connection per request ({generator})")
    _footer(fig, figures)
    return fig


SHAPE_NAMES = {"per_node": "address\nper node", "shared": "shared\naddresses"}
LATENCIES = {
    "to_false": "failed cycle end -> PATCH False",
    "to_true": "good cycle end -> PATCH True",
    "stream": "cycle end -> cluster stream update",
}


def cluster(figures: dict[str, Any]) -> Figure:
    """The simulated cluster: detection latency, and one controller's cost against shards."""
    runs = listed(figures, "runs")
    shards = [int(number(figures, "runs", i, "shards")) for i in range(len(runs))]
    # A run's shards and, where the file holds both shapes, its shape.
    shapes = [str(r.get("shape", "shared")) if isinstance(r, dict) else "shared" for r in runs]
    both = len(set(shapes)) > 1
    names = [
        f"{n} shard(s)" + (f"\n{SHAPE_NAMES.get(shape, shape)}" if both else "")
        for n, shape in zip(shards, shapes, strict=True)
    ]
    fig, (left, middle, right) = plt.subplots(
        1, 3, figsize=(15, 5.2), gridspec_kw={"width_ratios": [2.2, 1, 1]}
    )
    labels, p50, p99 = [], [], []
    for key, name in LATENCIES.items():
        for i, label in enumerate(names):
            labels.append(f"{name}\n{label.replace(chr(10), ' ', 1).replace(chr(10), ' ')}")
            p50.append(max(0.1, number(figures, "runs", i, "latency_ms", key, "p50")))
            p99.append(max(0.1, number(figures, "runs", i, "latency_ms", key, "p99")))
    ys = range(len(labels))
    left.barh([y + 0.2 for y in ys], p50, 0.4, color="tab:green", label="p50")
    left.barh([y - 0.2 for y in ys], p99, 0.4, color="tab:orange", label="p99")
    left.axvline(
        2000, color=TARGET, linewidth=1, linestyle="--", label="target p99 <= 2 s (PATCH False)"
    )
    left.set_xscale("log")
    left.set_yticks(list(ys), labels, fontsize=7)
    left.invert_yaxis()
    left.set_xlabel("ms from the agent cycle's end (log)")
    left.set_title(f"detection, {int(number(figures, 'nodes')):,} nodes x 8 GPUs", fontsize=10)
    left.legend(fontsize=8, loc="lower right")
    for ax, key, unit, target in (
        (middle, "cores", "cores", 0.25),
        (right, "rss_mib", "MiB", 512.0),
    ):
        per_run = [
            [
                number(figures, "runs", i, "controllers", j, key)
                for j in range(len(listed(figures, "runs", i, "controllers")))
            ]
            for i in range(len(runs))
        ]
        highest = [max(values) for values in per_run]
        xs = range(len(shards))
        ax.bar(xs, highest, 0.6, color=CAPWATCH, label="highest shard")
        for x, values in zip(xs, per_run, strict=True):
            ax.scatter([x] * len(values), values, color="black", s=10, zorder=3)
            ax.text(x + 0.32, max(values), _short(max(values)), va="center", fontsize=7)
        ax.scatter([], [], color="black", s=10, label="each shard")
        _target(ax, target, f"target <= {target:g} {unit}")
        ax.set_xticks(list(xs), names, fontsize=7 if both else None)
        ax.set_xlabel("controller shards" + (" and address shape" if both else ""))
        ax.set_ylim(0, max([*highest, target]) * 1.3)
        ax.set_ylabel(f"{unit} per controller, steady state")
        ax.legend(fontsize=8, loc="upper right")
    middle.set_title("controller CPU", fontsize=10)
    right.set_title("controller RSS", fontsize=10)
    fig.suptitle("capwatch controller following a simulated cluster")
    _footer(fig, figures)
    return fig


FENCING_COUNTS = {
    "admitted": "admitted after\nthe takeover",
    "refused": "refused after\nthe takeover",
    "left_after_deadline": "left after\ntheir deadline",
    "applied_after_deadline": "of those,\napplied",
    "dropped": "dropped\n(deadline passed)",
}


def fencing(figures: dict[str, Any]) -> Figure:
    """The leader-pause trial: the old leader's writes, with the policy and without."""
    settings = (("with_policy", "with the policy"), ("without_policy", "without"))
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    ours = [number(figures, "with_policy", key) for key in FENCING_COUNTS]
    theirs = [number(figures, "without_policy", key) for key in FENCING_COUNTS]
    _paired_bars(left, list(FENCING_COUNTS.values()), ours, theirs, ("with the policy", "without"))
    trials = int(number(figures, "with_policy", "trials"))
    left.set_title(
        f"the old leader's writes, summed over {trials} trials each "
        "(target with the policy: 0 admitted)",
        fontsize=10,
    )
    left.set_ylabel("writes")
    left.legend(loc="upper right", fontsize=8)
    for x, (key, _) in enumerate(settings):
        taken = numbers(figures, key, "takeover_s")
        right.scatter([x] * len(taken), taken, color=(CAPWATCH, BARE)[x], alpha=0.6)
        right.hlines(statistics.median(taken), x - 0.25, x + 0.25, color=TARGET)
    right.set_xticks(range(len(settings)), [label for _, label in settings])
    right.set_xlim(-0.6, len(settings) - 0.4)
    right.set_ylim(0, None)
    right.set_ylabel("s")
    window = f"{number(figures, 'window_ms', 'median'):g} / {number(figures, 'window_ms', 'max'):g}"
    right.set_title(
        f"freeze -> standby's Lease write, per trial (line: median)\n"
        f"the policy's window after a takeover, median / max: {window} ms",
        fontsize=10,
    )
    fig.suptitle("A leader frozen mid-burst on the real API server (bench/fencing.py)")
    _footer(fig, figures)
    return fig


PLOTS: dict[str, Callable[[dict[str, Any]], Figure]] = {
    "cycle": cycle,
    "stream": stream,
    "fanout": fanout,
    "readyz": readyz,
    "cluster": cluster,
    "fencing": fencing,
    "kwok": kwok,
}


def draw(results: Path, out: Path) -> list[Path]:
    """A PNG in ``out`` for each results file; BadFigures names the file at fault."""
    found = sorted(results.glob("*.json"))
    if not found:
        raise BadFigures(f"{results}: no results (*.json)")
    figures_of: dict[Path, dict[str, Any]] = {}
    for path in found:  # every file checked before any PNG is replaced
        if path.stem not in PLOTS:
            raise BadFigures(f"{path}: no chart for it (known: {', '.join(PLOTS)})")
        try:
            figures = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise BadFigures(f"{path}: {exc}") from exc
        if not isinstance(figures, dict):
            raise BadFigures(f"{path}: not a JSON object")
        figures_of[path] = figures
    drawn = []
    for path, figures in figures_of.items():
        try:
            fig = PLOTS[path.stem](figures)
        except (ValueError, BadFigures) as exc:
            plt.close("all")
            raise BadFigures(f"{path}: {exc}") from exc
        drawn.append((path, fig))
    written = []
    out.mkdir(parents=True, exist_ok=True)
    for path, fig in drawn:
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
