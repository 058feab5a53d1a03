"""Charts of the benchmark figures: a PNG in bench/plots/ for each bench/results/*.json.

Each file is written by its scenario's ``--json FILE`` (bench/figures/results.py: a JSON
object whose ``source`` says the date, the machine and the command) and drawn into a PNG
of the same name, which carries the chart's title and that source in its metadata
(``Title``, ``Source``) as well as at its foot. A file missing a figure, or holding the
wrong type, or no chart's, stops the run with one line naming the file and the figure,
before any PNG is replaced; nothing is drawn from a figure the bench did not measure.
The charts and the files' shapes: bench/figures/node_charts.py (cycle, stream, fanout,
readyz) and cluster_charts.py (cluster, kwok, fencing).

    python -m bench.figures.plot [--results DIR] [--out DIR]     # make bench-plots
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
from matplotlib.figure import Figure

from bench.figures.cluster_charts import cluster, fencing, kwok
from bench.figures.node_charts import cycle, fanout, readyz, stream
from bench.figures.values import BadFigures

BENCH = Path(__file__).resolve().parents[1]
PLOTS: dict[str, Callable[[dict[str, Any]], Figure]] = {
    "cycle": cycle,
    "stream": stream,
    "fanout": fanout,
    "readyz": readyz,
    "cluster": cluster,
    "fencing": fencing,
    "kwok": kwok,
}


def title(fig: Figure) -> str:
    """The chart's title: its own, else its first panel's."""
    return fig.get_suptitle() or fig.axes[0].get_title()


def metadata(fig: Figure, figures: dict[str, Any]) -> dict[str, str | None]:
    """The PNG's text chunks: what it shows and where the figures come from (no
    Software: the file does not change with matplotlib's version)."""
    return {"Software": None, "Title": title(fig), "Source": str(figures["source"])}


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
        except (ValueError, BadFigures) as exc:  # ValueError: matplotlib refused a value
            plt.close("all")
            raise BadFigures(f"{path}: {exc}") from exc
        drawn.append((path, fig))
    written = []
    out.mkdir(parents=True, exist_ok=True)
    for path, fig in drawn:
        target = out / f"{path.stem}.png"
        fig.savefig(target, dpi=100, metadata=metadata(fig, figures_of[path]))
        plt.close(fig)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=BENCH / "results")
    parser.add_argument("--out", type=Path, default=BENCH / "plots")
    args = parser.parse_args(argv)
    try:
        written = draw(args.results, args.out)
    except BadFigures as exc:
        print(f"plot: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
