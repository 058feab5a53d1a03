"""``capwatch demo --cluster``: a cluster of simulated nodes, a controller, every condition.

Three parts, as a cluster has them: ``capwatch pool`` serves 12 simulated nodes
from one process, with faults on a schedule (some nodes' cap writes fail,
some hang, some go silent, and all recover); ``capwatch controller --dry-run``
follows every node's stream as it follows real agents, and prints the Node
condition patches and Events it would write (shown as they come); and the
demo follows the controller's cluster stream (capwatch.v1.ClusterHealthService)
with the client and the table of ``capwatch watch --cluster`` (redrawn in
place on a terminal; elsewhere each change is printed as a row).

The pool and the controller are child processes that die with the demo even
when it is SIGKILLed (capwatch/child.py); each says on its log when it serves,
and a part that cannot start (a port in use) ends the demo with one line.
Ctrl-C (or SIGTERM) stops the controller, then the pool. Nothing is written
but the targets file, in a temporary directory that goes with the demo.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from capwatch.demo.settings import DemoError, DemoSettings
from capwatch.logs import configure_logging
from capwatch.watch.cluster_table import NodeBoard
from capwatch.watch.screen import Screen, log_stream, screen_for
from capwatch.watch.tables import FAILED, GOOD, QUIET
from client.cluster_health import ClusterHealthClient
from client.stream_events import ClusterEvent, ClusterSnapshot, Disconnected, NodeUpdate
from server.listeners import address_in_use

log = logging.getLogger(__name__)

NODES = 12
GPUS = 4
DEFAULT_INTERVAL_S = 1.0
# The schedule, in node intervals after a lead time for the parts to start and connect:
# (kind, fraction of the nodes, start, duration), every PERIOD intervals. With these
# fractions 4 of the 12 nodes' writes fail, 2 hang and 2 go silent (one node does all).
LEAD_S = 4.0
PERIOD = 40
SCHEDULE = (
    ("write_failed", 0.25, 4, 8),
    ("hang", 0.15, 10, 10),
    ("silent", 0.15, 16, 8),
)
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0
RETRY_S = 0.5
EXIT_OK, EXIT_FAILED = 0, 1


def _seconds(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")


def cluster_faults(interval_s: float) -> tuple[str, ...]:
    """The pool's ``--fault`` values for nodes cycling every ``interval_s``."""
    return tuple(
        f"{kind}:{fraction:g}@{_seconds(LEAD_S + start * interval_s)}"
        f"+{_seconds(duration * interval_s)}/{_seconds(PERIOD * interval_s)}"
        for kind, fraction, start, duration in SCHEDULE
    )


class Child:
    """A capwatch command run as a child process that dies with the demo.

    Its JSON log (stderr) is followed: it is ready once it logs ``ready_message``; the
    records it logged are kept by message, its last line that was not JSON (a one-line
    error) is its last words, and ``on_line`` sees each line of its standard output.
    """

    def __init__(
        self,
        what: str,
        argv: list[str],
        *,
        ready_message: str,
        on_record: Callable[[Mapping[str, Any]], None] = lambda record: None,
        on_line: Callable[[str], None] | None = None,
        on_death: Callable[[str], None] = lambda why: None,
    ) -> None:
        self.what = what
        self._argv = argv
        self._ready_message = ready_message
        self._on_record = on_record
        self._on_line = on_line
        self._on_death = on_death
        self.records: dict[str, Mapping[str, Any]] = {}
        self.said = ""
        self._ready = asyncio.Event()
        self._process: asyncio.subprocess.Process | None = None
        self._readers: list[asyncio.Task[None]] = []
        self._stopping = False

    async def start(self) -> None:
        """Start it and wait until it says it serves. Raises DemoError."""
        # Its own session: a Ctrl-C on the terminal is the demo's to handle, in order.
        # None of the demo's CAPWATCH_* twins: the child gets its flags and nothing else.
        env = {k: v for k, v in os.environ.items() if not k.startswith("CAPWATCH_")}
        process = self._process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "capwatch.child",
            str(os.getpid()),
            *self._argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL if self._on_line is None else asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        self._readers.append(
            asyncio.create_task(self._read_log(process), name=f"capwatch-demo-{self._argv[0]}-log")
        )
        if self._on_line is not None:
            self._readers.append(
                asyncio.create_task(self._read_out(process), name=f"capwatch-demo-{self._argv[0]}")
            )
        exited = asyncio.create_task(process.wait())
        ready = asyncio.create_task(self._ready.wait())
        try:
            await asyncio.wait(
                {exited, ready}, timeout=START_TIMEOUT_S, return_when="FIRST_COMPLETED"
            )
        finally:
            ready.cancel()
            exited.cancel()
        if not self._ready.is_set():
            if process.returncode is not None:
                await asyncio.gather(*self._readers)  # its last words
            why = self.said or f"no word from it in {START_TIMEOUT_S:g}s"
            raise DemoError(f"{self.what} did not start: {why}")

    async def stop(self) -> None:
        self._stopping = True
        process = self._process
        if process is not None and process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                process.kill()
                await process.wait()
        for reader in self._readers:
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _read_log(self, process: asyncio.subprocess.Process) -> None:
        assert process.stderr is not None  # created with stderr=PIPE
        async for raw in process.stderr:
            text = raw.decode(errors="replace").strip()
            try:
                record = json.loads(text)
            except ValueError:
                record = None
            if not isinstance(record, dict):
                self.said = text or self.said
                continue
            message = str(record.get("message", ""))
            self.records[message] = record
            if message.startswith(self._ready_message):
                self._ready.set()
            self._on_record(record)
        code = await process.wait()
        if not self._stopping and self._ready.is_set():
            how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
            said = f": {self.said}" if self.said else ""
            self._on_death(f"{self.what} {how}{said}")

    async def _read_out(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None  # created with stdout=PIPE when on_line is given
        assert self._on_line is not None
        async for raw in process.stdout:
            self._on_line(raw.decode(errors="replace").rstrip("\n"))


class ClusterDemo:
    def __init__(self, settings: DemoSettings, *, screen: Screen, state_dir: Path) -> None:
        self._settings = settings
        self._screen = screen
        self._targets = state_dir / "targets.txt"
        self._interval_s = settings.interval_s or DEFAULT_INTERVAL_S
        self._board = NodeBoard()  # capwatch watch --cluster's table
        self.stop = asyncio.Event()
        self.died: str | None = None
        faults = cluster_faults(self._interval_s)
        self._faults = faults
        self.pool = Child(
            "the pool",
            [
                "pool",
                f"--nodes={NODES}",
                f"--gpus={GPUS}",
                f"--interval={self._interval_s:g}",
                f"--grpc-listen={settings.grpc_listen[0]}",
                f"--targets-out={self._targets}",
                *(f"--fault={fault}" for fault in faults),
                "--log-format=json",
                "--log-level=info",
            ],
            ready_message="pool serving",
            on_record=self._pool_record,
            on_death=self._died,
        )
        self.controller = Child(
            "the controller",
            [
                "controller",
                "--dry-run",
                f"--targets={self._targets}",
                f"--grpc-listen={settings.cluster_listen}",
                # Both would listen on every interface, and are not the demo's story.
                "--metrics-port=0",
                "--probe-port=0",
                "--log-format=json",
                "--log-level=info",
            ],
            ready_message="controller started",
            on_record=self._controller_record,
            on_line=self._dry_run_line,
            on_death=self._died,
        )

    async def run(self) -> int:
        # Asked first, so a port in use is named by the demo's own flag; a child that
        # loses a race for its port still says so in its one line.
        for flag, address in (
            ("--grpc-listen", self._settings.grpc_listen[0]),
            ("--cluster-listen", self._settings.cluster_listen),
        ):
            why = address_in_use(address)
            if why is not None:
                raise DemoError(f"{flag}: cannot listen on {address}: {why}")
        await self.pool.start()
        await self.controller.start()
        pool_at = str(self.pool.records["pool serving"]["address"])
        cluster_at = str(self.controller.records["cluster stream serving"]["address"])
        self._intro(pool_at, cluster_at)
        follower = asyncio.create_task(self._follow(cluster_at), name="capwatch-demo-cluster")
        try:
            await self.stop.wait()
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
        return EXIT_FAILED if self.died else EXIT_OK

    async def close(self) -> None:
        """The controller first (it writes nothing more), then the pool."""
        await self.controller.stop()
        await self.pool.stop()

    def _intro(self, pool_at: str, cluster_at: str) -> None:
        node = "sim-node-0"
        for line in [
            f"capwatch demo --cluster: {NODES} simulated nodes of {GPUS} GPUs in one pool "
            "process, followed by a controller in --dry-run (it prints the Node condition "
            "patches and Events it would write).",
            f"Each node cycles every {self._interval_s:g}s; from about "
            f"{LEAD_S + SCHEDULE[0][2] * self._interval_s:g}s some nodes' cap writes fail "
            "(False), some hang or go silent (Unknown), and all recover (True), again every "
            f"{PERIOD * self._interval_s:g}s. Ctrl-C stops everything.",
            f"pool: {pool_at}   cluster stream: {cluster_at}",
            "watch it from another terminal:",
            f"  .venv/bin/capwatch watch --cluster --target {cluster_at}",
            f"  .venv/bin/capwatch watch --target {pool_at} --node {node}",
            "",
        ]:
            self._screen.note(((line, ""),))

    async def _follow(self, address: str) -> None:
        """The cluster stream, onto the screen as ``capwatch watch --cluster`` shows it;
        the client reconnects while the controller lives."""
        client = ClusterHealthClient(target=address)
        async with client, contextlib.aclosing(client.events()) as events:
            async for event in events:
                self._show(event)

    def _show(self, event: ClusterEvent) -> None:
        width = self._screen.width
        if isinstance(event, ClusterSnapshot):
            self._screen.show(self._board.snapshot(event.snapshot, event.received_at, width))
        elif isinstance(event, NodeUpdate):
            self._screen.show(self._board.update(event.update, event.received_at, width))
        elif isinstance(event, Disconnected):
            log.info("cluster stream lost error=%s", event.error)

    def _dry_run_line(self, line: str) -> None:
        style = FAILED if "=False" in line or line.startswith("EVENT Warning") else ""
        self._screen.note(((line, style or (GOOD if "=True" in line else "")),))

    def _pool_record(self, record: Mapping[str, Any]) -> None:
        # "pool node=... faults=...": what the pool does to a node, before the controller
        # sees its effect.
        if record.get("message") == "pool" and "node" in record and "faults" in record:
            faults = str(record["faults"])
            now = "no fault now" if faults == "-" else f"now {faults.replace(',', ', ')}"
            self._screen.note(((f"pool: {record['node']}: {now}", QUIET),))

    def _controller_record(self, record: Mapping[str, Any]) -> None:
        if record.get("level") in ("warning", "error"):
            self._screen.note(((f"controller: {record.get('message', '')}", QUIET),))

    def _died(self, why: str) -> None:
        if self.died is None:
            self.died = why
        self.stop.set()


def run_cluster_demo(settings: DemoSettings) -> int:
    """Run until Ctrl-C; raises DemoError (one line) when a part cannot start."""
    with tempfile.TemporaryDirectory(prefix="capwatch-demo-cluster-") as state_dir:
        return asyncio.run(_run(settings, Path(state_dir)))


async def _run(settings: DemoSettings, state_dir: Path) -> int:
    screen = screen_for(sys.stdout)
    configure_logging(settings.log_level, settings.log_format, stream=log_stream(screen))
    demo = ClusterDemo(settings, screen=screen, state_dir=state_dir)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, demo.stop.set)
    try:
        code = await demo.run()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await demo.close()
        screen.close()
    if demo.died is not None:
        print(f"capwatch demo: {demo.died}", file=sys.stderr)
        return EXIT_FAILED
    screen.note((("stopped: the controller and the pool have ended", ""),))
    return code
