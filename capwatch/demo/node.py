"""``capwatch demo``: the whole product on a laptop, in about a minute.

The agent runs on simulated GPUs with the built-in scenario (a cap write fails
for a few cycles, then recovers), serving its stream over gRPC and metrics
over HTTP; the readiness shim runs as its own process, as in the pod,
following the stream and serving ``/readyz``. Every cycle is shown as the
per-GPU table ``capwatch watch`` draws (redrawn in place on a terminal, only
what changed elsewhere), and every change of the shim's answer as a
``/readyz`` line: 503 before the first cycle, 200, 503 while the write fails,
200 again. Ctrl-C stops everything; caps are restored.

Nothing is trusted that the demo did not start: the shim says on its log
which port it bound before its answers are shown, and a part that cannot
start (a port in use) ends the demo with one line. The shim dies with the
demo even when the demo is SIGKILLed (capwatch/child.py), and the demo's
temporary state directory goes when it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from pathlib import Path

from capwatch.agent.assembly import load_settings_scenario
from capwatch.agent.lifecycle import ShutdownSummary
from capwatch.agent.reports import CycleReport
from capwatch.agent.settings import (
    AgentSettings,
    BackendKind,
    agent_settings,
)
from capwatch.demo.children import Child
from capwatch.demo.settings import (
    DemoError,
    DemoSettings,
)
from capwatch.kit.scratch import ScratchDirectory
from capwatch.launch import run_agent
from capwatch.logs import configure_logging
from capwatch.server.grpc import mapping
from capwatch.server.grpc.serving import AgentServer
from capwatch.server.settings import server_settings
from capwatch.watch.layout import FAILED, GOOD, Line, wrapped
from capwatch.watch.screen import Screen, log_stream, screen_for
from capwatch.watch.tables import Frame, GpuBoard

READYZ_POLL_S = 0.25
SHIM_START_TIMEOUT_S = 15.0
EXIT_OK, EXIT_FAILED = 0, 1


def run_demo(settings: DemoSettings) -> int:
    # Removed at the end, or by the next demo if this one is SIGKILLed.
    with ScratchDirectory("capwatch-demo-state-") as state_dir:
        return asyncio.run(_demo(settings, state_dir))


async def _demo(settings: DemoSettings, state_dir: Path) -> int:
    def agent(interval: float | None) -> AgentSettings:
        flags = {
            "gpu_backend": BackendKind.SIM.value,
            "scenario": None if settings.scenario is None else str(settings.scenario),
            "interval": None if interval is None else str(interval),
            "state_dir": str(state_dir),
            "log_level": settings.log_level,
            "log_format": settings.log_format.value,
        }
        return agent_settings(argparse.Namespace(**flags), {})

    chosen = agent(settings.interval_s)
    scenario = load_settings_scenario(chosen)
    if settings.interval_s is None and scenario.interval_seconds:
        chosen = agent(scenario.interval_seconds)
    serving = server_settings(
        argparse.Namespace(
            grpc_listen=list(settings.grpc_listen),
            metrics_port=str(settings.metrics_port or 0),
            metrics_address="127.0.0.1",
        ),
        {},
    )
    screen = screen_for(sys.stdout)
    configure_logging(settings.log_level, settings.log_format, stream=log_stream(screen))
    intro = [
        f"capwatch demo: {scenario.description.strip() or scenario.source}",
        f"node {chosen.node_name or scenario.node_name}, {len(scenario.gpus)} simulated GPUs, "
        f"a cycle every {chosen.interval_s:g}s; Ctrl-C stops everything and restores caps.",
    ]
    demo = _Demo(
        screen=screen,
        intro=intro,
        readyz_port=settings.readyz_port or _free_port(),
        metrics_port=serving.metrics_port,
    )
    try:
        code = await run_agent(
            chosen,
            serving,
            on_report=demo.show,
            on_serving=demo.serving,
            on_stopped=demo.stopped,
            max_cycles=settings.cycles,
            stop=demo.stop,
        )
    finally:
        await demo.stop_shim()
        screen.close()
    if demo.shim_died is not None:
        print(f"capwatch demo: {demo.shim_died}", file=sys.stderr)
        return EXIT_FAILED
    return code


def _free_port() -> int:
    # The shim binds it a moment later; if someone else is faster, the shim says so.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class _Demo:
    def __init__(
        self, *, screen: Screen, intro: list[str], readyz_port: int, metrics_port: int | None
    ) -> None:
        self._screen = screen
        self._intro = intro
        self._readyz_port = readyz_port
        self._metrics_port = metrics_port
        self._server: AgentServer | None = None
        self._board = GpuBoard()
        self._block: tuple[Line, ...] = ()
        self._answer: tuple[Line, ...] = ()  # the shim's latest answer, under the table
        self._shim: Child | None = None
        self._poller: asyncio.Task[None] | None = None
        self._last_answer = ""
        self.stop = asyncio.Event()
        self.shim_died: str | None = None

    async def serving(self, server: AgentServer) -> None:
        """Start the shim on the agent's stream; once it serves, show its first answer."""
        self._server = server
        target = next((a for a in server.addresses if not a.startswith("unix:")), None)
        target = target or server.addresses[0]
        await self._start_shim(target)
        metrics = f"http://127.0.0.1:{self._metrics_port}/metrics" if self._metrics_port else "off"
        for line in [
            *self._intro,
            f"stream: {', '.join(server.addresses)}   "
            f"readiness: http://127.0.0.1:{self._readyz_port}/readyz   metrics: {metrics}",
            "watch it from another terminal:",
            f"  .venv/bin/capwatch watch --target {target}",
            f"  .venv/bin/capwatch watch --target {target} --dra v1",
            f"  .venv/bin/grpcurl -plaintext {target} list",
            f"  curl -s http://127.0.0.1:{self._readyz_port}/readyz",
            "",
        ]:
            self._screen.note(((line, ""),))
        answer = await self._probe()
        if answer is None:
            raise DemoError(f"the readiness shim does not answer on 127.0.0.1:{self._readyz_port}")
        self._report(answer)
        self._poller = asyncio.create_task(self._poll(), name="capwatch-demo-readyz")

    def show(self, report: CycleReport) -> None:
        if self._server is None:
            return
        publication = self._server.publication
        view = publication.view()
        cycle = mapping.cycle(
            report,
            devices=publication.hub.devices_at(report.sequence) or view.state.devices,
            namer=publication.namer,
            ready=view.readiness,
            age_s=max(0.0, view.now_monotonic - report.finished_monotonic),
        )
        frame = self._board.cycle(cycle, self._screen.width)
        self._block = frame.block
        self._screen.show(
            Frame(block=self._with_answer(), changes=frame.changes, notes=frame.notes)
        )

    def stopped(self, summary: ShutdownSummary) -> None:
        if self._poller is not None:
            self._poller.cancel()
        restored = sum(1 for r in summary.restored if not r.failed)
        self._screen.close()  # the last table stays; the line below it
        self._screen.note(((f"stopped: default power limit restored on {restored} GPU(s)", ""),))

    async def stop_shim(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        if self._shim is not None:
            await self._shim.stop()

    async def _start_shim(self, target: str) -> None:
        port = self._readyz_port
        self._shim = Child(
            "the readiness shim",
            [
                "shim",
                f"--target={target}",
                "--readyz-address=127.0.0.1",
                f"--readyz-port={port}",
                "--log-format=json",
                "--log-level=info",
            ],
            is_ready=lambda r: r.get("message") == "serving /readyz" and r.get("port") == port,
            start_timeout_s=SHIM_START_TIMEOUT_S,
            on_death=self._shim_died,
        )
        await self._shim.start()

    def _shim_died(self, why: str) -> None:
        self.shim_died = why
        self.stop.set()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(READYZ_POLL_S)
            answer = await self._probe()
            # Once the agent stops its streams the shim fails closed (stream-lost), as it
            # must; the demo's story ends with the caps restored, not with that.
            if self._server is not None and self._server.publication.stopping.is_set():
                return
            if answer is not None:
                self._report(answer)

    def _report(self, answer: str) -> None:
        status, _, body = answer.partition(" ")
        style = GOOD if status == "200" else FAILED
        text = f">>> /readyz {status}: {body}"
        self._answer = tuple(wrapped(text, self._screen.width, first="", then="    ", style=style))
        # Note changes of status or reason only: the age in the body moves every poll.
        summary = status if status == "200" else f"{status} {body.split(';')[0]}"
        if summary != self._last_answer:
            self._last_answer = summary
            self._screen.note(((text, style),))
        if self._block:
            self._screen.show(Frame(block=self._with_answer()))

    def _with_answer(self) -> tuple[Line, ...]:
        return (*self._block, *self._answer)

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
