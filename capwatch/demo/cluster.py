"""``capwatch demo --cluster``: a cluster of simulated nodes, a controller, every condition.

Three parts, as a cluster has them: ``capwatch pool`` serves 12 simulated nodes
(``sim-node-0`` to ``sim-node-11``) from one process, with faults on a schedule
(:data:`SCHEDULE`, in node intervals after a 4 s lead; the times here are at
the default 1 s interval): about 8 s in, the cap writes of sim-node-1, -8, -10 and -11
fail (False, CapWriteFailed) for 8 s; at 14 s sim-node-2 and -9 hang
(Unknown, CycleStale) for 10 s; at 20 s sim-node-4 and -7 go silent (Unknown,
AgentUnreachable) for 8 s; every node then recovers (True), and it all
repeats every 40 s. The other four nodes stay True throughout. The intro says
the same, at the interval in use. ``capwatch controller --dry-run`` follows
every node's stream as it follows real agents, and prints the Node
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
import functools
import logging
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from capwatch.agent.sim.poolspec import PoolFault, PoolFaultKind, node_names
from capwatch.client.cluster_health import ClusterHealthClient
from capwatch.client.stream_events import ClusterEvent, ClusterSnapshot, Disconnected, NodeUpdate
from capwatch.demo.children import Child, logged
from capwatch.demo.settings import DemoError, DemoSettings
from capwatch.kit.scratch import ScratchDirectory
from capwatch.logs import configure_logging
from capwatch.server.listeners import address_in_use
from capwatch.watch.cluster_table import NodeBoard, natural_key
from capwatch.watch.layout import FAILED, GOOD, QUIET
from capwatch.watch.screen import Screen, log_stream, screen_for

log = logging.getLogger(__name__)

NODES = 12
NODE_PREFIX = "sim-node-"  # the pool's default
GPUS = 4
DEFAULT_INTERVAL_S = 1.0
# The schedule, in node intervals after a lead time for the parts to start and connect:
# (kind, the nodes it hits, start, duration), again every PERIOD intervals: 4 nodes'
# writes fail, then 2 hang and 2 go silent, 8 different nodes. The pool picks a fault's
# nodes itself: those whose hash with the fault's place in its --fault list falls below
# the fault's fraction. So each entry is passed with the fraction that picks exactly its
# nodes (:func:`pool_fraction`), which must be the lowest-hashed for its place: these
# nodes, in this order, are (a kind takes two places where one would reach a node an
# earlier entry has; tests/test_demo_cluster.py holds the pool to them).
LEAD_S = 4.0
PERIOD = 40
SCHEDULE: tuple[tuple[str, tuple[str, ...], int, int], ...] = (
    ("write_failed", ("sim-node-1", "sim-node-8", "sim-node-10", "sim-node-11"), 4, 8),
    ("hang", ("sim-node-2",), 10, 10),
    ("hang", ("sim-node-9",), 10, 10),
    ("silent", ("sim-node-7",), 16, 8),
    ("silent", ("sim-node-4",), 16, 8),
)
# What the intro says each kind does to its nodes, and what the controller shows for it.
_TOLD = {
    "write_failed": "the cap writes of {nodes} fail for {for_s}s (False, CapWriteFailed)",
    "hang": "{nodes} hang for {for_s}s (Unknown, CycleStale)",
    "silent": "{nodes} go silent for {for_s}s (Unknown, AgentUnreachable)",
}
EXIT_OK, EXIT_FAILED = 0, 1


def _seconds(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")


def cluster_faults(interval_s: float) -> tuple[str, ...]:
    """The pool's ``--fault`` values for nodes cycling every ``interval_s``, in
    :data:`SCHEDULE`'s order (a fault's place in the list is part of what it picks)."""
    return tuple(
        f"{kind}:{pool_fraction(slot)}@{_seconds(LEAD_S + start * interval_s)}"
        f"+{_seconds(duration * interval_s)}/{_seconds(PERIOD * interval_s)}"
        for slot, (kind, _, start, duration) in enumerate(SCHEDULE)
    )


@functools.cache
def pool_fraction(slot: int) -> str:
    """The shortest fraction (as the flag spells it) with which the pool's fault in place
    ``slot`` hits exactly :data:`SCHEDULE`'s nodes for it, found by the pool's own rule
    (:meth:`~capwatch.agent.sim.poolspec.PoolFault.hits`). Raises ValueError when none does."""
    kind, nodes, _, _ = SCHEDULE[slot]
    names = node_names(NODES, prefix=NODE_PREFIX)

    def hit(fraction: float) -> set[str]:
        fault = PoolFault(
            kind=PoolFaultKind(kind), fraction=fraction, start_s=0, duration_s=1, slot=slot
        )
        return {name for name in names if fault.hits(name)}

    def least(name: str) -> float:  # the least fraction that hits ``name``, to 2**-52
        low, high = 0.0, 1.0
        for _ in range(52):
            middle = (low + high) / 2
            low, high = (low, middle) if name in hit(middle) else (middle, high)
        return high

    wanted = set(nodes)
    floor = max(least(name) for name in wanted)
    for places in range(1, 13):
        text = f"{(int(floor * 10**places) + 1) / 10**places:.{places}f}"
        if hit(float(text)) == wanted:
            return text
    raise ValueError(f"the pool's fault {slot} cannot hit exactly {', '.join(sorted(nodes))}")


def schedule_lines(interval_s: float) -> list[str]:
    """What the schedule does, for the intro: to which nodes, when, for how long, and
    what the controller makes of it (every entry of a kind has the same window)."""
    told = []
    for kind, sentence in _TOLD.items():
        entries = [entry for entry in SCHEDULE if entry[0] == kind]
        nodes = sorted((n for entry in entries for n in entry[1]), key=natural_key)
        named = f"{', '.join(nodes[:-1])} and {nodes[-1]}" if len(nodes) > 1 else nodes[0]
        _, _, start, duration = entries[0]
        at, for_s = LEAD_S + start * interval_s, duration * interval_s
        told.append(f"from about {at:g}s " + sentence.format(nodes=named, for_s=f"{for_s:g}"))
    untouched = NODES - len({n for entry in SCHEDULE for n in entry[1]})
    return [
        f"Each node cycles every {interval_s:g}s; " + "; ".join(told) + "; then every node is "
        f"True again, and it all repeats every {PERIOD * interval_s:g}s. The other "
        f"{untouched} nodes stay True. Ctrl-C stops everything."
    ]


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
            *schedule_lines(self._interval_s),
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
    # Removed at the end, or by the next demo if this one is SIGKILLed.
    with ScratchDirectory("capwatch-demo-cluster-") as state_dir:
        return asyncio.run(_run(settings, state_dir))


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
