"""Results files: where a scenario's figures go with ``--json FILE``, for the charts.

A file is a JSON object whose ``source`` line says where its figures come from (the
date, the machine and the command: bench.shared.run), written whole or not at all; a
``--json FILE`` that cannot be written is refused in one line before a long run, not
after it. Two benches keep runs across runs:

- cluster.py: one run per shard count and address shape; a run replaces the file's run
  of the same ``--shards`` and shape and keeps the others, the real cluster's shape (an
  address per node) first;
- kwok.py: the latest two runs (bench/README.md and docs/scale.md quote two).

A file of another ``--nodes``, or not such a file, is refused in one line before the run
and left as it was.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.shared.run import this_run

SHAPES = {"per_node": "an address per node", "shared": "shared addresses"}
KEEP_KWOK_RUNS = 2


def write_json(path: Path, figures: dict[str, Any], *, source: str | None = None) -> None:
    """``figures`` with their source first (this run's unless given), written whole or not
    at all."""
    origin = this_run() if source is None else source
    content = json.dumps({"source": origin, **figures}, indent=1) + "\n"
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(content)
    partial.replace(path)  # a run cut short leaves the previous figures in place


def check_writable(path: Path | None) -> None:
    """Refuse before a long run, not after it, a --json FILE that cannot be written."""
    if path is None:
        return
    if not path.parent.is_dir():
        raise SystemExit(f"--json {path}: no such directory {path.parent}")
    if path.is_dir():
        raise SystemExit(f"--json {path}: is a directory")
    if not os.access(path.parent, os.W_OK):
        raise SystemExit(f"--json {path}: cannot write in {path.parent}")


def held_runs(
    path: Path | None, nodes: int, bench: str, check: Callable[[dict[str, Any]], object] = bool
) -> list[dict[str, Any]]:
    """The runs a bench's --json FILE holds already (``check`` raises on a run that is
    not one of ``bench``'s); SystemExit, one line, before a long run, for a file this run
    must not overwrite: not such a file, or of another --nodes."""
    check_writable(path)
    if path is None or not path.exists():
        return []
    try:
        held = json.loads(path.read_text())
        runs, held_nodes = list(held["runs"]), int(held["nodes"])
        for run in runs:
            check(run)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise SystemExit(f"--json {path}: not a {bench} results file ({exc!r})") from exc
    if held_nodes != nodes:
        raise SystemExit(
            f"--json {path}: holds {held_nodes}-node runs, this one is {nodes}: another file"
        )
    return runs


def run_shape(run: dict[str, Any]) -> str:
    """A cluster run's shape; the runs from before there was a choice were all shared."""
    return str(run.get("shape", "shared"))


def earlier_cluster_runs(
    path: Path | None, nodes: int, this_shards: int, this_shape: str
) -> list[dict[str, Any]]:
    """The runs a cluster.py --json FILE already holds for the other shard counts and
    shapes (this run's are measured again); SystemExit, one line, for a file this run must
    not overwrite."""
    runs = held_runs(path, nodes, "cluster.py", check=lambda r: int(r["shards"]))
    return [r for r in runs if (int(r["shards"]), run_shape(r)) != (this_shards, this_shape)]


def write_cluster_runs(path: Path, nodes: int, runs: list[dict[str, Any]]) -> None:
    # The real cluster's shape first, as the figures are quoted.
    runs = sorted(runs, key=lambda r: (run_shape(r) != "per_node", int(r["shards"])))
    summary = "; ".join(
        f"{r['shards']} shard(s), {SHAPES[run_shape(r)]}: {r['source']}" for r in runs
    )
    write_json(path, {"nodes": nodes, "runs": runs}, source=summary)


def write_kwok_runs(path: Path, runs: list[dict[str, Any]]) -> None:
    """The latest runs of kwok.py, each with its own source, the file's naming them all."""
    runs = runs[-KEEP_KWOK_RUNS:]
    summary = "; ".join(f"run {i + 1}: {r['source']}" for i, r in enumerate(runs))
    write_json(path, {"nodes": runs[-1]["nodes"], "runs": runs}, source=summary)
