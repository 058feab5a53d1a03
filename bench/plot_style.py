"""What every chart of bench/plot.py shares: colours, tick formats, the target line and
the footer naming where the figures were measured."""

from __future__ import annotations

import textwrap
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter
from plot_values import get

PLAIN = FuncFormatter(lambda value, _: f"{value:g}")  # 30, not 3 x 10^1
# On a log axis, minor ticks labelled at 2, 3 and 5 of each decade only.
SPARSE = FuncFormatter(lambda value, _: f"{value:g}" if f"{value:e}"[0] in "235" else "")

CAPWATCH, BARE, TARGET = "tab:blue", "tab:gray", "tab:red"


def footer(fig: Figure, figures: dict[str, Any]) -> None:
    """The source at the bottom, wrapped to the figure's width, with room kept for it."""
    lines = textwrap.wrap(f"Measured: {get(figures, 'source')}", int(fig.get_figwidth() * 17))
    fig.text(0.01, 0.01, "\n".join(lines), fontsize=7, color="dimgray", va="bottom")
    fig.set_layout_engine("tight", rect=(0, 0.015 + 0.11 * len(lines) / fig.get_figheight(), 1, 1))


def target(ax: Axes, y: float, label: str) -> None:
    ax.axhline(y, color=TARGET, linewidth=1, linestyle="--", label=label)
