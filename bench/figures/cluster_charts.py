"""The controller side's charts: the simulated cluster, 5,000 KWOK nodes on the real API
server, the leader frozen mid-burst. Each draws its results file into a figure, reading
it through bench.figures.values (a missing figure or a wrong type: BadFigures, naming it).

The files' shapes (``[]`` a list; ``{p}``: ``{"p50", "p99"}`` in ms):

- ``cluster.json`` (bench/scenarios/cluster.py): ``nodes``, ``runs[]`` one per shard
  count and shape, each with ``shards``, ``controllers[]`` (``cores``, ``rss_mib``) and
  ``latency_ms``: ``to_false`` {p}, ``to_true`` {p}, ``stream`` {p}; a run may carry
  ``shape`` (``per_node`` or ``shared``; none: shared).
- ``kwok.json`` (bench/scenarios/kwok.py): ``nodes``, ``runs[]`` (the latest two), each
  with ``subscribed_s``, ``failing``, ``detected``, ``floor_rss_mib`` and ``steady``: per
  heartbeat (``heartbeat_300``, ``heartbeat_60``) ``cores`` and ``rss_mib`` by component
  (``controller``, ``kube-apiserver``, ``etcd``, ``kwok``, ``kube-controller-manager``).
- ``fencing.json`` (bench/scenarios/fencing.py): ``with_policy`` and ``without_policy``,
  each with ``trials``, ``admitted``, ``refused``, ``left_after_deadline``,
  ``applied_after_deadline``, ``dropped`` and ``takeover_s[]`` (one per trial);
  ``window_ms``: ``median``, ``max``.
"""

from __future__ import annotations

import statistics
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from bench.figures.style import (
    BARE,
    CAPWATCH,
    TARGET,
    footer,
    paired_bars,
    short,
    target_line,
)
from bench.figures.values import BadFigures, get, listed, number, numbers

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
            ax.text(x + 0.32, max(values), short(max(values)), va="center", fontsize=7)
        ax.scatter([], [], color="black", s=10, label="each shard")
        target_line(ax, target, f"target <= {target:g} {unit}")
        ax.set_xticks(list(xs), names, fontsize=7 if both else None)
        ax.set_xlabel("controller shards" + (" and address shape" if both else ""))
        ax.set_ylim(0, max([*highest, target]) * 1.3)
        ax.set_ylabel(f"{unit} per controller, steady state")
        ax.legend(fontsize=8, loc="upper right")
    middle.set_title("controller CPU", fontsize=10)
    right.set_title("controller RSS", fontsize=10)
    fig.suptitle("capwatch controller following a simulated cluster")
    footer(fig, figures)
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
    paired_bars(left, list(FENCING_COUNTS.values()), ours, theirs, ("with the policy", "without"))
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
    fig.suptitle("A leader frozen mid-burst on the real API server (bench/scenarios/fencing.py)")
    footer(fig, figures)
    return fig


COMPONENTS = ("controller", "kube-apiserver", "etcd", "kwok", "kube-controller-manager")
COLOURS = {
    "controller": CAPWATCH,
    "kube-apiserver": "tab:purple",
    "etcd": "tab:brown",
    "kwok": "tab:olive",
    "kube-controller-manager": "tab:cyan",
}


def kwok(figures: dict[str, Any]) -> Figure:
    runs = listed(figures, "runs")
    nodes = int(number(figures, "nodes"))
    settings: list[tuple[str, int, str]] = []  # (label, run, steady key)
    for i in range(len(runs)):
        steady = get(figures, "runs", i, "steady")
        if not isinstance(steady, dict) or not steady:
            raise BadFigures(f"runs[{i}].steady is not an object of heartbeats")
        for key in sorted(steady, key=lambda k: -float(k.rsplit("_", 1)[1])):
            settings.append((f"run {i + 1}\nheartbeat {key.rsplit('_', 1)[1]} s", i, key))
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.4))
    width = 0.8 / len(COMPONENTS)
    for ax, measure, unit in ((left, "cores", "cores"), (right, "rss_mib", "MiB")):
        highest = 0.0
        for c, component in enumerate(COMPONENTS):
            values = [
                number(figures, "runs", i, "steady", key, measure, component)
                for _, i, key in settings
            ]
            xs = [x + (c - (len(COMPONENTS) - 1) / 2) * width for x in range(len(settings))]
            ax.bar(xs, values, width, color=COLOURS[component], label=component)
            highest = max(highest, *values)
        ax.set_ylim(0, highest * 1.5)  # room for the legend above the bars
        ax.set_xticks(range(len(settings)), [label for label, _, _ in settings], fontsize=8)
        ax.set_ylabel(f"{unit}, steady state")
    target_line(left, 0.25, "controller target <= 0.25 core")
    target_line(right, 512.0, "controller target <= 512 MiB")
    floors = [number(figures, "runs", i, "floor_rss_mib") for _, i, _ in settings]
    offset = -(len(COMPONENTS) - 1) / 2 * width
    right.scatter(
        [x + offset for x in range(len(settings))],
        floors,
        color="black",
        marker="_",
        s=400,
        zorder=3,
        label="bare grpc.aio client, same streams (floor)",
    )
    left.set_title("CPU", fontsize=10)
    right.set_title("RSS", fontsize=10)
    left.legend(fontsize=7, loc="upper center", ncol=3)
    right.legend(fontsize=7, loc="upper center", ncol=3)
    detection = ", ".join(
        f"run {i + 1}: {int(number(figures, 'runs', i, 'detected'))}/"
        f"{int(number(figures, 'runs', i, 'failing'))} detected, subscribed in "
        f"{number(figures, 'runs', i, 'subscribed_s'):.0f} s"
        for i in range(len(runs))
    )
    fig.suptitle(
        f"{nodes:,} KWOK nodes, an address per node, on the real API server "
        f"(bench/scenarios/kwok.py)\n{detection}",
        fontsize=11,
    )
    footer(fig, figures)
    return fig
