"""``capwatch`` subprocesses for the end-to-end tests, their output in files.

stdout and stderr go to files, so nothing blocks on a pipe and a test can read a
process's log at any time; every process a test started is stopped after it
(SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[3]
CAPWATCH = (sys.executable, "-m", "capwatch.cli")
START_S = 30.0  # a Python process starting on a loaded 2-core machine
CHANGE_S = 15.0  # a change to reach the Node once everything runs
_T = TypeVar("_T")


def wait_until(predicate: Callable[[], _T], *, timeout: float = CHANGE_S, what: str) -> _T:
    """Poll ``predicate`` until it returns something true (which is returned)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        time.sleep(0.02)


@dataclass(kw_only=True)
class Process:
    """A ``capwatch`` subprocess; its stdout and stderr in files."""

    name: str
    popen: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path

    @property
    def log(self) -> str:
        return self.stderr.read_text(errors="replace")

    @property
    def output(self) -> str:
        return self.stdout.read_text(errors="replace")

    def wait_log(self, pattern: str, *, timeout: float = START_S) -> re.Match[str]:
        """The first stderr line matching ``pattern``; fails if the process exits first."""
        regex = re.compile(pattern)

        def found() -> re.Match[str] | None:
            exited = self.popen.poll() is not None  # first: its last lines are in the file
            match = regex.search(self.log)
            if match is None and exited:
                raise AssertionError(
                    f"{self.name} exited {self.popen.returncode} before /{pattern}/:\n"
                    + self.log[-3000:]
                )
            return match

        return wait_until(found, timeout=timeout, what=f"{self.name} logging /{pattern}/")

    def signal(self, number: int) -> float:
        """Send ``number``; the monotonic instant it was sent."""
        at = time.monotonic()
        self.popen.send_signal(number)
        return at

    def wait(self, timeout: float = 20.0) -> int:
        return self.popen.wait(timeout=timeout)


def clean_environ() -> dict[str, str]:
    """This process's environment without capwatch's, grpc's or Kubernetes' settings."""
    prefixes = ("CAPWATCH_", "GRPC_", "KUBERNETES_")
    names = ("KUBECONFIG", "POD_NAME", "POD_NAMESPACE", "NODE_NAME")
    return {k: v for k, v in os.environ.items() if not k.startswith(prefixes) and k not in names}


class Processes:
    """The subprocesses of one test, stopped (SIGTERM, then SIGKILL) when it ends."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._started: list[Process] = []
        self.environ = clean_environ()

    def start(self, name: str, args: Sequence[str]) -> Process:
        out, err = self._directory / f"{name}.out", self._directory / f"{name}.err"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            popen = subprocess.Popen(
                [*CAPWATCH, *args],
                cwd=ROOT,
                env=self.environ,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
            )
        process = Process(name=name, popen=popen, stdout=out, stderr=err)
        self._started.append(process)
        return process

    def close(self) -> None:
        running = [p for p in self._started if p.popen.poll() is None]
        for process in running:
            process.popen.send_signal(signal.SIGTERM)
        for process in running:
            try:
                process.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait(timeout=10)
