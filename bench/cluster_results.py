"""bench/cluster.py's results file: one run per shard count and address shape.

A run replaces the file's run of the same ``--shards`` and shape and keeps the others,
so one file holds the shard sweep and both shapes, the real cluster's (an address per
node) first; a file of another ``--nodes``, or not such a file, is refused in one line
before a long run, and left as it was.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.figures import held_runs, write_json

SHAPES = {"per_node": "an address per node", "shared": "shared addresses"}


def run_shape(run: dict[str, Any]) -> str:
    """A run's shape; the runs from before there was a choice were all shared."""
    return str(run.get("shape", "shared"))


def earlier_runs(
    path: Path | None, nodes: int, this_shards: int, this_shape: str
) -> list[dict[str, Any]]:
    """The runs a --json FILE already holds for the other shard counts and shapes (this
    run's are measured again); SystemExit, one line, for a file this run must not
    overwrite."""
    runs = held_runs(path, nodes, "cluster.py", check=lambda r: int(r["shards"]))
    return [r for r in runs if (int(r["shards"]), run_shape(r)) != (this_shards, this_shape)]


def write_runs(path: Path, nodes: int, runs: list[dict[str, Any]]) -> None:
    # The real cluster's shape first, as the figures are quoted.
    runs = sorted(runs, key=lambda r: (run_shape(r) != "per_node", int(r["shards"])))
    summary = "; ".join(
        f"{r['shards']} shard(s), {SHAPES[run_shape(r)]}: {r['source']}" for r in runs
    )
    write_json(path, {"nodes": nodes, "runs": runs}, source=summary)
