"""Where a bench's figures go with ``--json FILE``: a JSON object bench/plot.py draws.

Every file carries a ``source`` line saying where its figures come from: the
date, the machine and the command that measured them, so a chart never shows
figures whose origin is not on it.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def machine() -> str:
    """The CPU model, its cores and the Python that ran the bench."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass  # not Linux: the platform's own name will do
    return f"{os.cpu_count()} cores ({model}), Python {sys.version.split()[0]}"


def command() -> str:
    """This process's command line as it would be typed from the repository root."""
    script = Path(sys.argv[0])
    return shlex.join(["python", f"bench/{script.name}", *sys.argv[1:]])


def this_run() -> str:
    return f"{time.strftime('%Y-%m-%d %H:%M %Z')}, {machine()}: {command()}"


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


def spread(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` as even as can be, the larger shares first."""
    return [total // parts + (i < total % parts) for i in range(parts)]
