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
import logging
import signal
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from capwatch.demo.children import Child, logged
from capwatch.demo.settings import DemoError, DemoSettings
from capwatch.logs import configure_logging
from capwatch.watch.cluster_table import NodeBoard
from capwatch.watch.layout import FAILED, GOOD, QUIET
from capwatch.watch.screen import Screen, log_stream, screen_for
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
            is_ready=logged("pool serving"),
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
            is_ready=logged("controller started"),
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
