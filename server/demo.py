"""``capwatch demo``: the whole product on a laptop, in about a minute.

The agent runs on simulated GPUs with the built-in scenario (a cap write fails
for a few cycles, then recovers), serving its stream over gRPC and metrics
over HTTP; the readiness shim runs as its own process, as in the pod,
following the stream and serving ``/readyz``. Every cycle is printed as a
per-GPU table, and every change of the shim's answer as a ``/readyz`` line:
503 before the first cycle, 200, 503 while the write fails, 200 again.
Ctrl-C stops everything; caps are restored.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import tempfile
import time

from agent.assembly import load_settings_scenario
from agent.errors import CapwatchError
from agent.lifecycle import ShutdownSummary
from agent.rendering import render_report
from agent.reports import CycleReport
from agent.settings import BackendKind, agent_settings
from server.launch import run_agent
from server.logs import configure_logging
from server.serving import AgentServer
from server.settings import server_settings

DEFAULT_DEMO_LISTEN = "127.0.0.1:50051"
DEFAULT_READYZ_PORT = 8081
DEFAULT_METRICS_PORT = 9400
READYZ_POLL_S = 0.25
SHIM_START_TIMEOUT_S = 15.0


class DemoError(CapwatchError):
    """The demo's shim could not be started."""


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", help="scenario file (default: the built-in scenario)")
    parser.add_argument("--interval", help="seconds between cycles (default: the scenario's)")
    parser.add_argument("--cycles", type=int, default=None, help="stop after this many cycles")
    parser.add_argument(
        "--grpc-listen",
        action="append",
        help=f"address to serve the stream on, repeatable (default {DEFAULT_DEMO_LISTEN})",
    )
    parser.add_argument(
        "--readyz-port",
        type=int,
        default=DEFAULT_READYZ_PORT,
        help=f"port of the shim's /readyz on 127.0.0.1 (default {DEFAULT_READYZ_PORT})",
    )
    parser.add_argument(
        "--metrics-port",
        default=str(DEFAULT_METRICS_PORT),
        help=f"metrics on 127.0.0.1 (default {DEFAULT_METRICS_PORT}; 0 turns them off)",
    )


def run_demo(args: argparse.Namespace) -> int:
    flags = {
        "gpu_backend": BackendKind.SIM.value,
        "scenario": args.scenario,
        "state_dir": tempfile.mkdtemp(prefix="capwatch-demo-state-"),
        "log_level": "error",  # the tables say what the warnings would
    }
    settings = agent_settings(argparse.Namespace(**flags, interval=args.interval), {})
    scenario = load_settings_scenario(settings)
    if args.interval is None and scenario.interval_seconds:
        interval = str(scenario.interval_seconds)
        settings = agent_settings(argparse.Namespace(**flags, interval=interval), {})
    serving = server_settings(
        argparse.Namespace(
            grpc_listen=args.grpc_listen or [DEFAULT_DEMO_LISTEN],
            metrics_port=args.metrics_port,
            metrics_address="127.0.0.1",
        ),
        {},
    )
    configure_logging(settings.log_level, settings.log_format)
    print(f"capwatch demo: {scenario.description.strip() or scenario.source}")
    print(
        f"node {settings.node_name or scenario.node_name}, {len(scenario.gpus)} simulated GPUs, "
        f"a cycle every {settings.interval_s:g}s; Ctrl-C stops everything and restores caps.",
        flush=True,
    )
    demo = _Demo(readyz_port=args.readyz_port, metrics_port=serving.metrics_port)
    try:
        return asyncio.run(
            run_agent(
                settings,
                serving,
                on_report=demo.show,
                on_serving=demo.serving,
                on_stopped=demo.stopped,
                max_cycles=args.cycles,
            )
        )
    finally:
        demo.stop_shim()


class _Demo:
    def __init__(self, *, readyz_port: int, metrics_port: int | None) -> None:
        self._readyz_port = readyz_port
        self._metrics_port = metrics_port
        self._shim: subprocess.Popen[bytes] | None = None
        self._poller: asyncio.Task[None] | None = None
        self._last_answer = ""

    async def serving(self, server: AgentServer) -> None:
        """Start the shim on the agent's stream, and show its first answer before cycle 1."""
        target = next((a for a in server.addresses if not a.startswith("unix:")), None)
        target = target or server.addresses[0]
        # Popen returns as soon as the child is forked; the wait is asynchronous below.
        self._shim = subprocess.Popen(  # noqa: ASYNC220
            [
                sys.executable,
                "-m",
                "server.cli",
                "shim",
                "--target",
                target,
                "--readyz-address",
                "127.0.0.1",
                "--readyz-port",
                str(self._readyz_port),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + SHIM_START_TIMEOUT_S
        while (answer := await self._probe()) is None:
            if self._shim.poll() is not None:
                error = (self._shim.stderr.read() if self._shim.stderr else b"").decode().strip()
                raise DemoError(f"the readiness shim did not start: {error.splitlines()[-1:]}")
            if time.monotonic() > deadline:
                raise DemoError("the readiness shim did not answer on /readyz in time")
            await asyncio.sleep(0.1)
        metrics = f"http://127.0.0.1:{self._metrics_port}/metrics" if self._metrics_port else "off"
        print(
            f"stream: {', '.join(server.addresses)}   "
            f"readiness: http://127.0.0.1:{self._readyz_port}/readyz   metrics: {metrics}\n"
            f"watch it from another terminal:\n"
            f"  .venv/bin/capwatch watch --target {target}\n"
            f"  .venv/bin/capwatch watch --target {target} --dra v1\n"
            f"  .venv/bin/grpcurl -plaintext {target} list\n"
            f"  curl -s http://127.0.0.1:{self._readyz_port}/readyz\n",
            flush=True,
        )
        self._report(answer)
        self._poller = asyncio.create_task(self._poll(), name="capwatch-demo-readyz")

    def show(self, report: CycleReport) -> None:
        print(render_report(report) + "\n", flush=True)

    def stopped(self, summary: ShutdownSummary) -> None:
        if self._poller is not None:
            self._poller.cancel()
        restored = sum(1 for r in summary.restored if not r.failed)
        print(f"stopped: default power limit restored on {restored} GPU(s)", flush=True)

    def stop_shim(self) -> None:
        if self._shim is not None and self._shim.poll() is None:
            self._shim.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._shim.wait(timeout=5)
        if self._shim is not None and self._shim.poll() is None:
            self._shim.kill()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(READYZ_POLL_S)
            answer = await self._probe()
            if answer is not None:
                self._report(answer)

    def _report(self, answer: str) -> None:
        status, _, body = answer.partition(" ")
        # Print changes of status or reason only: the age in the body moves every poll.
        summary = status if status == "200" else f"{status} {body.split(';')[0]}"
        if summary != self._last_answer:
            self._last_answer = summary
            print(f">>> /readyz {status}: {body}", flush=True)

    async def _probe(self) -> str | None:
        """``"<status> <body>"`` from the shim, or None if it does not answer yet."""
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", self._readyz_port), 1.0
            )
        except (OSError, TimeoutError):
            return None
        try:
            writer.write(b"GET /readyz HTTP/1.1\r\nHost: demo\r\n\r\n")
            raw = await asyncio.wait_for(reader.read(), 1.0)
        except (OSError, TimeoutError):
            return None
        finally:
            writer.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        parts = head.split(b" ", 2)
        if len(parts) < 2:
            return None
        return f"{parts[1].decode()} {body.decode().strip()}"
