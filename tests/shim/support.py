"""Real ``capwatch shim`` and ``capwatch agent`` processes, probed over real HTTP.

The shim runs as a subprocess against either a :mod:`tests.server.harness`
server in the test's own event loop (the test decides which cycles exist and
when) or a real sim agent subprocess. ``GET /readyz`` is asked with
``http.client`` on a worker thread, so the harness keeps serving while a probe
waits. Every process writes its output to files, so nothing blocks on a pipe
and a test can count the lines afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import itertools
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from capwatch.agent.folding import crashed_report
from capwatch.agent.reports import CycleReport
from tests.server.harness import UUIDS, ServerHarness, ok, start_harness

CAPWATCH = (sys.executable, "-m", "capwatch.cli")
ROOT = Path(__file__).resolve().parents[2]
POLL_S = 0.02
START_S = 15.0  # generous: a loaded 2-core machine starts Python slowly
STOP_S = 10.0

# One GPU, one annotated pod, no faults: every cycle of this agent is enforced.
SCENARIO = """\
node_name: shim-test-node
safe_default_watts: 300
gpus:
  - uuid: GPU-5e5e5e5e-0000-4000-8000-0000000000a0
    min_watts: 200
    max_watts: 700
    default_watts: 700
pods:
  - namespace: ml
    name: trainer
    uid: a0000000-0000-4000-8000-0000000000a1
    annotations: {capwatch.io/gpu-power-limit: "450"}
processes:
  - {gpu: 0, pid: 4101, pod: a0000000-0000-4000-8000-0000000000a1}
"""

_REASON = re.compile(r"not ready: ([a-z-]+)")
_AGE = re.compile(r"last good cycle (?:never|([0-9.]+)s ago)")


@dataclass(frozen=True, kw_only=True)
class Probe:
    """One ``GET /readyz`` answer, with the monotonic times it was asked and answered."""

    status: int
    body: str
    sent: float
    received: float

    @property
    def reason(self) -> str:
        """``ready``, or the 503's reason (``stale``, ``stream-lost``, ...)."""
        if self.status == 200:
            return "ready"
        match = _REASON.match(self.body)
        assert match is not None, f"unexpected /readyz body {self.body!r}"
        return match[1]

    @property
    def good_age_s(self) -> float | None:
        """The last good cycle's age the body states; None when it says never."""
        match = _AGE.search(self.body)
        assert match is not None, f"no age in /readyz body {self.body!r}"
        return None if match[1] is None else float(match[1])


def free_port() -> int:
    """A port nothing listens on right now (someone may take it before us: retry then)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _get(port: int, timeout: float) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", "/readyz")
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


async def until(condition: Callable[[], bool], *, within: float, what: str) -> None:
    """Poll ``condition`` without blocking the event loop; fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within:g}s: {what}")
        await asyncio.sleep(POLL_S)


@dataclass(kw_only=True)
class Process:
    """A ``capwatch`` subprocess whose stdout and stderr go to files."""

    popen: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path

    def out(self) -> str:
        return self.stdout.read_text()

    def err(self) -> str:
        return self.stderr.read_text()

    def lines(self) -> list[str]:
        """Every line written so far, stdout's then stderr's."""
        return self.out().splitlines() + self.err().splitlines()

    @property
    def running(self) -> bool:
        return self.popen.poll() is None

    async def exited(self, *, within: float) -> int:
        """The exit code, once the process has exited; fails after ``within`` seconds."""
        await until(lambda: not self.running, within=within, what=f"exit of {self.popen.args!r}")
        return self.popen.wait()

    async def terminate(self, *, within: float = STOP_S) -> int:
        """SIGTERM and the exit code; SIGKILL (and fail) if it outlives ``within``."""
        if self.running:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return await self.exited(within=within)
        finally:
            self.kill()

    def kill(self) -> None:
        if self.running:
            self.popen.kill()
        self.popen.wait()

    def send(self, sig: signal.Signals) -> None:
        self.popen.send_signal(sig)


@dataclass(kw_only=True)
class Shim(Process):
    """A running ``capwatch shim``; every answer it gave is kept in ``history``."""

    port: int
    history: list[Probe] = field(default_factory=list)

    async def probe(self, *, timeout: float = 5.0) -> Probe:
        sent = time.monotonic()
        status, body = await asyncio.to_thread(_get, self.port, timeout)
        answer = Probe(status=status, body=body, sent=sent, received=time.monotonic())
        self.history.append(answer)
        return answer

    async def until(self, accept: Callable[[Probe], bool], *, within: float, what: str) -> Probe:
        """Probe until an answer is accepted (returned); fail after ``within`` seconds."""
        deadline = time.monotonic() + within
        while True:
            answer = await self.probe()
            if accept(answer):
                return answer
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"not within {within:g}s: {what}; last answer {answer.status} "
                    f"{answer.body!r}; shim stderr:\n{self.err()}"
                )
            await asyncio.sleep(POLL_S)

    async def probe_for(self, seconds: float) -> list[Probe]:
        """Every answer of ``seconds`` of continuous probing."""
        answers = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            answers.append(await self.probe())
            await asyncio.sleep(POLL_S)
        return answers


def spawn(argv: Sequence[str], *, directory: Path, env: Mapping[str, str] | None = None) -> Process:
    """Start ``capwatch argv...`` with its output in fresh files under ``directory``."""
    for n in itertools.count():
        stem = directory / f"{argv[0]}-{n}"
        if not stem.with_suffix(".err").exists():
            break
    stdout, stderr = stem.with_suffix(".out"), stem.with_suffix(".err")
    with stdout.open("wb") as out, stderr.open("wb") as err:
        popen = subprocess.Popen(
            [*CAPWATCH, *argv],
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
        )
    return Process(popen=popen, stdout=stdout, stderr=stderr)


def _started(process: Process, line: str) -> bool:
    """The process logged ``line``, or exited (it will not log it then)."""
    return line in process.err() or not process.running


def shim_argv(target: str, port: int) -> list[str]:
    return [
        "shim",
        "--target",
        target,
        "--readyz-port",
        str(port),
        "--readyz-address",
        "127.0.0.1",
    ]


class Launcher:
    """Starts harnesses, shims and agents for one test, and stops whatever is left."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._processes: list[Process] = []
        self._harnesses: list[ServerHarness] = []

    async def harness(self, *, interval_s: float) -> ServerHarness:
        started = await start_harness(interval_s=interval_s)
        self._harnesses.append(started)
        return started

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Process:
        process = spawn(argv, directory=self.directory, env=env)
        self._processes.append(process)
        return process

    async def shim(self, target: str, *, attempts: int = 3) -> Shim:
        """A shim serving /readyz on a free port (another port if that one got taken)."""
        for _ in range(attempts):
            port = free_port()
            process = self.spawn(shim_argv(target, port))
            shim = Shim(
                popen=process.popen, stdout=process.stdout, stderr=process.stderr, port=port
            )
            await until(
                partial(_started, shim, "serving /readyz"),
                within=START_S,
                what="the shim's start line",
            )
            if shim.running:
                return shim
            assert "--readyz-port" in shim.err(), shim.err()  # only a port collision is retried
        raise AssertionError(f"no free port in {attempts} attempts")

    async def ready_shim(self, *, interval_s: float) -> tuple[ServerHarness, Shim]:
        """A harness and a shim subscribed to it, answering 200 after a good cycle."""
        harness = await self.harness(interval_s=interval_s)
        shim = await self.shim(harness.target)
        await until(
            lambda: harness.publication.subscribers == 1, within=START_S, what="shim subscribed"
        )
        deadline = time.monotonic() + START_S
        while True:  # like the loop: a cycle per interval (one may arrive stale on a slow box)
            publish_cycle(harness)
            with contextlib.suppress(AssertionError):
                await shim.until(lambda a: a.status == 200, within=interval_s, what="200")
                return harness, shim
            assert time.monotonic() < deadline, f"no 200 within {START_S}s:\n{shim.err()}"

    async def agent(self, socket_path: Path, *, interval_s: float) -> Process:
        """A sim agent (every cycle enforced) serving on ``socket_path``, metrics off."""
        scenario = self.directory / "scenario.yaml"
        scenario.write_text(SCENARIO)
        agent = self.spawn(
            [
                "agent",
                "--gpu-backend",
                "sim",
                "--scenario",
                str(scenario),
                "--interval",
                str(interval_s),
                "--metrics-port",
                "0",
                "--grpc-listen",
                f"unix://{socket_path}",
                "--state-dir",
                str(self.directory / "state"),
            ],
            # The sim's /proc tree goes under TMPDIR: keep it in the test's directory,
            # where a SIGKILLed agent's is cleaned up too.
            env={"TMPDIR": str(self.directory)},
        )
        await until(
            partial(_started, agent, "grpc serving"),
            within=START_S,
            what="the agent's serving line",
        )
        assert agent.running, agent.err()
        return agent

    async def close(self) -> None:
        """SIGTERM every process still running (last started first), then stop harnesses."""
        for process in reversed(self._processes):
            with contextlib.suppress(AssertionError):
                await process.terminate()
        for started in self._harnesses:
            await started.server.stop()


def publish_cycle(
    harness: ServerHarness,
    *,
    wall_offset_s: float = 0.0,
    started_monotonic: float | None = None,
) -> CycleReport:
    """Publish an enforced cycle finishing now (monotonic), its wall times shifted.

    ``started_monotonic``: when the cycle began (default: a millisecond ago),
    for a cycle that took long.
    """
    harness.sequence += 1
    mono, wall = harness.clock.monotonic(), harness.clock.wall() + wall_offset_s
    started = mono - 0.001 if started_monotonic is None else started_monotonic
    report = CycleReport(
        sequence=harness.sequence,
        started_wall=wall - (mono - started),
        finished_wall=wall,
        started_monotonic=started,
        finished_monotonic=mono,
        gpus=tuple(ok(i) for i in range(len(UUIDS))),
    )
    harness.hub.publish(report)
    return report


def publish_crash(harness: ServerHarness, exc: Exception) -> CycleReport:
    """Publish what the loop publishes for a cycle that raised ``exc``."""
    harness.sequence += 1
    report = crashed_report(
        sequence=harness.sequence,
        started_wall=harness.clock.wall() - 0.001,
        started_monotonic=harness.clock.monotonic() - 0.001,
        clock=harness.clock,
        exc=exc,
    )
    harness.hub.publish(report)
    return report


def check_staleness(probes: Sequence[Probe], *, finished: float, bound: float) -> None:
    """Answers after a cycle that finished at ``finished`` (monotonic), with none since.

    The shim's age is the agent's at send plus the shim's own time since
    receipt, so it lags the true age by the transit time, never leads it: a
    ``stale`` answer means the bound had truly passed, and a 200 may come at
    most a transit time late.
    """
    transit_s = 0.25
    for answer in probes:
        assert answer.reason in ("ready", "stale"), answer
        if answer.reason == "stale":
            assert answer.received >= finished + bound, (
                f"stale {answer.received - finished:.3f}s after the cycle, bound {bound}s"
            )
        else:
            assert answer.sent < finished + bound + transit_s, (
                f"still ready {answer.sent - finished:.3f}s after the cycle, bound {bound}s"
            )
