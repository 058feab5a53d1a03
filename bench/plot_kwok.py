"""bench/plot.py's chart of ``kwok.json`` (bench/kwok.py): what 5,000 nodes in a real
cluster's shape cost the controller and the control plane, run by run, at the default
heartbeat and at 60 s, the controller's RSS beside the floor and its target."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from plot_style import CAPWATCH, footer, target
from plot_values import BadFigures, get, listed, number

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
    target(left, 0.25, "controller target <= 0.25 core")
    target(right, 512.0, "controller target <= 512 MiB")
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
        f"(bench/kwok.py)\n{detection}",
        fontsize=11,
    )
    footer(fig, figures)
    return fig
