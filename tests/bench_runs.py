"""Running a bench script as its users do, for the tests of bench/: from the repository,
with the repository on the path, its output captured, within a timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def bench(script: str, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """``bench/SCRIPT ARGS...``, finished (whatever its exit status)."""
    return subprocess.run(
        [sys.executable, f"bench/{script}", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
