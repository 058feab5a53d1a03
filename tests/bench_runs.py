"""Running a benchmark as its users do, for the tests of bench/: ``python -m
bench.scenarios.NAME`` from the repository, its output captured, within a timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def bench(name: str, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """``python -m bench.scenarios.NAME ARGS...``, finished (whatever its exit status)."""
    return subprocess.run(
        [sys.executable, "-m", f"bench.scenarios.{name}", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
