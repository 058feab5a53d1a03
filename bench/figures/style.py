"""What every chart shares: colours, tick formats, paired bars of capwatch against its
floor, the target line, a ratio's verdict, and the footer naming where the figures were
measured."""

from __future__ import annotations

import textwrap
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from bench.figures.values import get
from bench.shared.stats import verdict

PLAIN = FuncFormatter(lambda value, _: f"{value:g}")  # 30, not 3 x 10^1
# On a log axis, minor ticks labelled at 2, 3 and 5 of each decade only.
SPARSE = FuncFormatter(lambda value, _: f"{value:g}" if f"{value:e}"[0] in "235" else "")

CAPWATCH, BARE, TARGET = "tab:blue", "tab:gray", "tab:red"


def footer(fig: Figure, figures: dict[str, Any]) -> None:
    """The source at the bottom, wrapped to the figure's width, with room kept for it."""
    lines = textwrap.wrap(f"Measured: {get(figures, 'source')}", int(fig.get_figwidth() * 17))
    fig.text(0.01, 0.01, "\n".join(lines), fontsize=7, color="dimgray", va="bottom")
    fig.set_layout_engine("tight", rect=(0, 0.015 + 0.11 * len(lines) / fig.get_figheight(), 1, 1))


def target_line(ax: Axes, y: float, label: str) -> None:
    ax.axhline(y, color=TARGET, linewidth=1, linestyle="--", label=label)


def short(value: float) -> str:
    """A bar's label: whole numbers from 100, three figures below."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def judged(ratio: float, target: float, *, at_least: bool) -> str:
    """``0.90 (>= 0.8: met)``: a ratio beside its target."""
    met = ratio >= target if at_least else ratio <= target
    return f"{ratio:.2f} ({'>=' if at_least else '<='} {target:g}: {verdict(met)})"


def paired_bars(
    ax: Axes,
    groups: list[str],
    ours: list[float],
    bare: list[float],
    labels: tuple[str, str] = ("capwatch", "bare grpc.aio"),
) -> None:
    """capwatch's bar beside its floor's in each group, each labelled with its value while
    there are few enough groups to read them."""
    width = 0.38
    xs = range(len(groups))
    ax.bar([x - width / 2 for x in xs], ours, width, color=CAPWATCH, label=labels[0])
    ax.bar([x + width / 2 for x in xs], bare, width, color=BARE, label=labels[1])
    ax.set_xticks(list(xs), groups)
    ax.set_ylim(0, max(ours + bare) * 1.35)  # headroom for the legend and the labels
    if len(groups) > 4:  # too many to label readably: the axis says
        return
    for x, (a, b) in enumerate(zip(ours, bare, strict=True)):
        ax.text(x - width / 2, a, short(a), ha="center", va="bottom", fontsize=7)
        ax.text(x + width / 2, b, short(b), ha="center", va="bottom", fontsize=7)
