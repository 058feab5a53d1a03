"""Helpers for the metrics tests: scraping, a capwatch agent subprocess, sockets.

The agent runs as the real command line on simulated GPUs; its stderr (the
log) is drained by a thread so tests can wait for a line without blocking.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

CAPWATCH = [sys.executable, "-m", "capwatch.cli"]
Series = tuple[str, frozenset[tuple[str, str]]]


def prometheus_tool(name: str) -> str:
    """A binary of Debian's prometheus package (prometheus, promtool): in CI its absence
    is a failure (.ci/run installs it), elsewhere a skip."""
    found = shutil.which(name)
    if found is None:
        message = f"{name} not found (apt-get install --no-install-recommends prometheus)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; .ci/run installs it")
        pytest.skip(message)
    return found


def samples(text: str) -> dict[Series, float]:
    """Every sample of a text exposition, by name and label set."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(registry: CollectorRegistry) -> dict[Series, float]:
    return samples(generate_latest(registry).decode())


def value(found: Mapping[Series, float], name: str, **labels: str) -> float:
    """One sample's value; KeyError names the series when it is absent."""
    key = (name, frozenset(labels.items()))
    if key not in found:
        raise KeyError(f"no series {name}{labels}")
    return found[key]


def series_of(found: Mapping[Series, float], name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in found.items() if n == name}


def is_nan(number: float) -> bool:
    return math.isnan(number)


async def eventually(condition: Callable[[], bool], *, timeout: float = 2.0) -> None:
    """Wait until ``condition()`` holds; TimeoutError after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110 (state owned by the code under test)
            await asyncio.sleep(0.005)


def free_port() -> int:
    """A port nothing listens on now (the tiny race is acceptable in tests)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(url: str, *, timeout: float = 5.0, accept: str | None = None) -> str:
    assert url.startswith("http://127.0.0.1:"), url
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})  # noqa: S310
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
        return str(response.read().decode())


def listening_tcp_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on, from /proc (Linux)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            match = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(fd))
        except OSError:  # closed while we looked
            continue
        if match:
            inodes.add(int(match[1]))
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[9]) in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


@dataclass
class AgentProcess:
    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def wait_for(self, pattern: str, *, timeout: float = 15.0) -> re.Match[str]:
        """The first log line matching ``pattern``; fails if the agent exits first."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        seen = 0
        while True:
            while seen < len(self.lines):
                match = regex.search(self.lines[seen])
                seen += 1
                if match:
                    return match
            if self.proc.poll() is not None:
                time.sleep(0.1)  # let the reader finish the last lines
                if seen == len(self.lines):
                    raise AssertionError(f"agent exited {self.proc.returncode}:\n{self.log}")
                continue
            if time.monotonic() > deadline:
                raise AssertionError(f"no log line /{pattern}/ in {timeout}s:\n{self.log}")
            time.sleep(0.02)

    @property
    def log(self) -> str:
        return "".join(self.lines)

    @property
    def grpc_target(self) -> str:
        return self.wait_for(r"grpc serving addresses=(\S+)")[1]


@contextmanager
def running(
    argv: Sequence[str], *, env: Mapping[str, str] | None = None, stderr_log: bool = True
) -> Iterator[AgentProcess]:
    """A process (capwatch, prometheus), its stderr drained into ``lines`` by a thread;
    SIGTERM, then kill, after. Neither capwatch's settings nor grpc's (this process's)
    leak into it."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("CAPWATCH_", "GRPC_"))}
    environ.update(env or {})
    proc = subprocess.Popen(
        list(argv),
        env=environ,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE if stderr_log else subprocess.DEVNULL,
        text=True,
    )
    process = AgentProcess(proc)
    reader = None
    if proc.stderr is not None:
        stderr = proc.stderr
        reader = threading.Thread(target=lambda: process.lines.extend(stderr), daemon=True)
        reader.start()
    try:
        yield process
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        finally:
            proc.kill()
            if reader is not None:
                reader.join(timeout=5)
            if proc.stderr is not None:
                proc.stderr.close()


@contextmanager
def running_agent(
    tmp_path: Path, args: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> Iterator[AgentProcess]:
    """``capwatch agent`` on simulated GPUs (0.2 s interval), stopped with SIGTERM after."""
    argv = [
        *CAPWATCH,
        "agent",
        "--gpu-backend",
        "sim",
        "--interval",
        "0.2",
        "--grpc-listen",
        "127.0.0.1:0",
        "--state-dir",
        str(tmp_path / "state"),
        *args,
    ]
    with running(argv, env=env) as agent:
        yield agent
