"""Many simulated nodes in one process: each its own agent, all on one cycle thread.

Each :class:`PoolNode` is a whole node agent but for the process: its own
simulated world (:mod:`capwatch.agent.sim.poolspec` writes its scenario), reconciler,
ownership record (in memory: a pool's GPUs die with it), sequence numbers
and hub. What they share is the thread their cycles run on: a pool of 5,000
nodes does not need 5,000 threads, since a simulated cycle never blocks. The
world is its own proc root (cgroups computed, not written to 5,000 trees).

Cycles are staggered: node ``i`` of ``n`` first cycles ``i/n`` of an interval
after the start, and each node sleeps one interval after each of its cycles,
as the agent's loop does. Before each cycle the fault schedule is applied:
``write_failed`` fails GPU 0's cap write; ``hang`` skips the node's cycles (as
a hung NVML call keeps a real agent from completing any); ``silent`` and
``vanish`` skip them too and tell the server side, through
:meth:`Pool.states`, to cut or refuse the node's streams.
"""

from __future__ import annotations

import heapq
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from capwatch.agent.attribution import Attributor
from capwatch.agent.devices import inventory
from capwatch.agent.gpus import GpuErrorClass
from capwatch.agent.hub import Hub
from capwatch.agent.ownership import OwnershipStore
from capwatch.agent.reconciling import Reconciler
from capwatch.agent.reports import CycleReport
from capwatch.agent.sim.poolspec import PoolFault, PoolFaultKind, node_names, node_scenario
from capwatch.agent.sim.scenario import FaultOp, FaultSpec
from capwatch.agent.sim.views import SimGpuBackend, SimPodView
from capwatch.agent.sim.world import SimWorld
from capwatch.agent.stepping import Policy
from capwatch.kit.clock import Clock
from capwatch.kit.readiness import stale_after

log = logging.getLogger(__name__)

HUB_CAPACITY = 8  # cycles kept per node for resuming streams (the agent keeps 256)
# Writes each node's simulated GPUs remember: every cycle writes every GPU, and an
# unbounded log grew by ~180 bytes per write (1.7 GB an hour at 5,000 x 8 GPUs / 15 s).
WRITE_LOG = 64
_WRITE_FAULT = FaultSpec(op=FaultOp.SET_LIMIT, gpu=0, error=GpuErrorClass.NO_PERMISSION)


@dataclass(frozen=True, kw_only=True)
class PoolSettings:
    nodes: int
    name_prefix: str = "sim-node-"
    first_index: int = 0
    gpus: int = 8
    interval_s: float = 15.0
    faults: tuple[PoolFault, ...] = ()
    annotation_key: str = "capwatch.io/gpu-power-limit"
    safe_default_watts: int = 300


class PoolNode:
    """One simulated node agent (without a process, a thread or a server of its own)."""

    def __init__(self, name: str, *, settings: PoolSettings, clock: Clock) -> None:
        self.name = name
        self.world = SimWorld(node_scenario(name, gpus=settings.gpus), write_log=WRITE_LOG)
        backend = SimGpuBackend(self.world)
        self.store = OwnershipStore(None, clock=clock)
        self.reconciler = Reconciler(
            backend=backend,
            pods=SimPodView(self.world),
            attributor=Attributor(self.world),
            store=self.store,
            clock=clock,
            policy=Policy(
                annotation_key=settings.annotation_key,
                safe_default_watts=settings.safe_default_watts,
            ),
            initial_device_count=settings.gpus,
            listeners=(self.world,),
        )
        uuids = {i: g.uuid for i, g in enumerate(self.world.scenario.gpus)}
        self.hub = Hub(
            clock=clock,
            stale_after_s=stale_after(settings.interval_s),
            capacity=HUB_CAPACITY,
            devices=inventory(uuids, wall=clock.wall()),
        )
        # Which scheduled faults hit this node, decided once.
        self.faults = tuple(f for f in settings.faults if f.hits(name))
        self._write_fault_on = False

    def active(self, elapsed_s: float) -> frozenset[PoolFaultKind]:
        return frozenset(f.kind for f in self.faults if f.active(elapsed_s))

    def cycle(self, kinds: frozenset[PoolFaultKind]) -> CycleReport | None:
        """One cycle under ``kinds`` of fault, published; None when the fault skips it."""
        failing = PoolFaultKind.WRITE_FAILED in kinds
        if failing != self._write_fault_on:
            if failing:
                self.world.add_fault(_WRITE_FAULT)
            else:
                self.world.clear_faults()
            self._write_fault_on = failing
        if kinds & {PoolFaultKind.HANG, PoolFaultKind.SILENT, PoolFaultKind.VANISH}:
            return None
        report = self.reconciler.reconcile_once()
        self.hub.publish(report)
        return report


StateListener = Callable[[str, frozenset[PoolFaultKind]], None]


class Pool:
    """Every node, and the one daemon thread that runs their cycles in turn."""

    def __init__(
        self,
        settings: PoolSettings,
        *,
        clock: Clock,
        on_faults: StateListener | None = None,
        on_cycle: Callable[[PoolNode, CycleReport], None] | None = None,
    ) -> None:
        self.settings = settings
        self._clock = clock
        names = node_names(settings.nodes, prefix=settings.name_prefix, first=settings.first_index)
        self.nodes = {name: PoolNode(name, settings=settings, clock=clock) for name in names}
        self._on_faults = on_faults  # called on the cycle thread when a node's faults change
        self._on_cycle = on_cycle
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started_at = 0.0
        self._faults: dict[str, frozenset[PoolFaultKind]] = {}
        self.cycles = 0
        self.skipped = 0

    def elapsed(self) -> float:
        return self._clock.monotonic() - self._started_at

    def start(self) -> None:
        self._started_at = self._clock.monotonic()
        self._thread = threading.Thread(target=self._run, name="capwatch-pool-cycles", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        interval, count = self.settings.interval_s, len(self.nodes)
        due: list[tuple[float, int, str]] = [
            (self._started_at + interval * i / count, i, name) for i, name in enumerate(self.nodes)
        ]
        heapq.heapify(due)
        while due and not self._stop.is_set():
            at, order, name = due[0]
            wait = at - self._clock.monotonic()
            if wait > 0:
                # On the pool's clock, as the agent's loop does: a FakeClock then runs
                # the schedule in fake time instead of stalling it in real time.
                self._clock.sleep(wait, self._stop)
                continue
            heapq.heappop(due)
            node = self.nodes[name]
            try:
                self._cycle(node)
            except Exception:  # one node's bug must not stop the other nodes
                log.exception("pool node=%s cycle raised", name)
            # The agent's rule: sleep an interval after each cycle.
            heapq.heappush(due, (self._clock.monotonic() + interval, order, name))

    def _cycle(self, node: PoolNode) -> None:
        kinds = node.active(self.elapsed())
        if kinds != self._faults.get(node.name, frozenset()):
            self._faults[node.name] = kinds
            log.info(
                "pool node=%s faults=%s", node.name, ",".join(sorted(k.value for k in kinds)) or "-"
            )
            if self._on_faults is not None:
                self._on_faults(node.name, kinds)
        report = node.cycle(kinds)
        if report is None:
            self.skipped += 1
            return
        self.cycles += 1
        if self._on_cycle is not None:
            self._on_cycle(node, report)

    def names(self) -> Sequence[str]:
        return tuple(self.nodes)
