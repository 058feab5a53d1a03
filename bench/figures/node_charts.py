"""The node side's charts: one reconcile cycle, the Watch stream, its fan-out against
subscribers, the readiness shim. Each draws its results file into a figure, reading it
through bench.figures.values (a missing figure or a wrong type: BadFigures, naming it).

The files' shapes (``[]`` a list, one entry per round):

- ``cycle.json`` (bench/scenarios/cycle.py): ``kube_ms`` and ``floor_ms``, every cycle's
  time with the list+watch pod view and with the in-memory one.
- ``stream.json`` (bench/scenarios/stream.py): ``throughput``: ``msg_s.capwatch[]``,
  ``msg_s.bare[]``, ``ratio``, ``target``; ``fanout``: ``subscribers``, ``rounds``,
  ``capwatch`` and ``bare`` each with ``p50``, ``p99``, ``max``, ``hand_off`` (ms,
  medians of the rounds) and ``kib_per_subscriber``, then ``p99_ratio``,
  ``hand_off_ratio``, ``p99_target``, ``hand_off_target``; ``cycle``: ``subscribers``,
  ``ratios.frozen[]``, ``ratios["never reading"][]``, ``target``. A part run alone
  (``--only``) leaves the others out, and the chart draws what is there.
- ``fanout.json`` (bench/scenarios/fanout.py): ``points[]``, each a ``fanout`` object as
  in stream.json (with ``pace_s``), at rising ``subscribers``.
- ``readyz.json`` (bench/scenarios/readyz.py): ``clients``, ``rounds[]`` each
  ``{"shim": L, "bare": L}`` with L ``{"req_s", "p50_ms", "p99_ms"}``,
  ``ratio_target``, ``rss_mib`` (``ready``, ``warm``, ``after``, ``peak``),
  ``rss_target_mib``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from bench.figures.style import (
    BARE,
    CAPWATCH,
    PLAIN,
    SPARSE,
    TARGET,
    footer,
    judged,
    paired_bars,
    target_line,
)
from bench.figures.values import BadFigures, get, listed, number, numbers


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
    footer(fig, figures)
    return fig


def _throughput(ax: Axes, f: dict[str, Any], key: str) -> None:
    ours = numbers(f, key, "msg_s", "capwatch")
    bare = numbers(f, key, "msg_s", "bare")
    if len(ours) != len(bare):
        raise BadFigures(f"{key}.msg_s: capwatch and bare have different rounds")
    paired_bars(ax, [str(i + 1) for i in range(len(ours))], ours, bare)
    ratio, target = number(f, key, "ratio"), number(f, key, "target")
    ax.set_title(
        f"Watch throughput, one client\nmedian ratio {judged(ratio, target, at_least=True)}"
    )
    ax.set_xlabel("round (alternated)")
    ax.set_ylabel("cycle messages/s")
    ax.legend(loc="upper left", fontsize=8)


def _fanout_bars(ax: Axes, f: dict[str, Any], key: str) -> None:
    keys = ("p50", "p99", "max", "hand_off")
    ours = [number(f, key, "capwatch", k) for k in keys]
    bare = [number(f, key, "bare", k) for k in keys]
    paired_bars(ax, ["p50", "p99", "max", "hand-off"], ours, bare)
    p99 = judged(number(f, key, "p99_ratio"), number(f, key, "p99_target"), at_least=False)
    hand = judged(
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
    target_line(ax, target, f"target <= {target:g}")
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
    paired_bars(ax, ["server RSS"], [ours], [bare])
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
    footer(fig, figures)
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
    footer(fig, figures)
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
    paired_bars(left, names, shim, bare, labels)
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
    paired_bars(middle, groups, ours, theirs, labels)
    middle.set_title("latency, request written -> answer read", fontsize=10)
    middle.set_ylabel("ms")
    middle.legend(loc="upper left", fontsize=8)
    stages = ("ready", "warm", "after", "peak")
    rss = [number(figures, "rss_mib", s) for s in stages]
    right.bar(range(len(stages)), rss, color=CAPWATCH)
    for x, v in enumerate(rss):
        right.text(x, v, f"{v:.1f}", ha="center", va="bottom", fontsize=7)
    rss_target = number(figures, "rss_target_mib")
    target_line(right, rss_target, f"target <= {rss_target:g} MiB")
    right.set_xticks(range(len(stages)), ["ready", "after\nwarm-up", "after\nthe load", "peak"])
    right.set_ylim(0, max([*rss, rss_target]) * 1.25)
    right.set_ylabel("MiB")
    right.set_title("shim resident memory", fontsize=10)
    right.legend(loc="upper left", fontsize=8)
    generator = figures.get("load_generator", "")
    fig.suptitle(f"Readiness shim: GET /readyz, a connection per request ({generator})")
    footer(fig, figures)
    return fig
