"""This run's metadata, the ``source`` line every results file opens with: the date, the
machine and the command that measured the figures, so a chart never shows figures whose
origin is not on it."""

from __future__ import annotations

import os
import platform
import shlex
import sys
import time
from pathlib import Path


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
    """This process's command line as it would be typed from the repository root:
    ``python -m bench.scenarios.NAME ARGS`` (or the script's path, run as one)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is None:
        return shlex.join(["python", sys.argv[0], *sys.argv[1:]])
    return shlex.join(["python", "-m", spec.name, *sys.argv[1:]])


def this_run() -> str:
    return f"{time.strftime('%Y-%m-%d %H:%M %Z')}, {machine()}: {command()}"
