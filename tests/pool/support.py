"""A clock that runs a pool's schedule in fake time, and records of what the pool did."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from capwatch.agent.reports import CycleReport
from capwatch.agent.sim.pool import Pool, PoolNode, PoolSettings
from capwatch.agent.sim.poolspec import PoolFaultKind, parse_fault
from capwatch.kit.clock import FakeClock

START = 1000.0  # FakeClock's monotonic origin


class HorizonClock(FakeClock):
    """A FakeClock whose sleeps end the run once they would pass ``horizon`` (monotonic):
    the pool's thread then runs every cycle due before it, at once, and stops."""

    def __init__(self, horizon: float) -> None:
        super().__init__(monotonic=START)
        self.horizon = horizon
        self.reached = threading.Event()

    def sleep(self, seconds: float, stop: threading.Event | None = None) -> bool:
        if stop is not None and self.monotonic() + seconds >= self.horizon:
            stop.set()
            self.reached.set()
            return True
        return super().sleep(seconds, stop)


@dataclass(frozen=True, kw_only=True)
class Ran:
    node: str
    at: float  # the fake monotonic instant the cycle ran
    report: CycleReport


@dataclass(frozen=True, kw_only=True)
class Changed:
    node: str
    at: float
    kinds: frozenset[PoolFaultKind]


class Recorder:
    """The pool's cycles and fault changes, in the order they happened."""

    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock
        self.cycles: list[Ran] = []
        self.changes: list[Changed] = []

    def on_cycle(self, node: PoolNode, report: CycleReport) -> None:
        self.cycles.append(Ran(node=node.name, at=self._clock.monotonic() - START, report=report))

    def on_faults(self, node: str, kinds: frozenset[PoolFaultKind]) -> None:
        self.changes.append(Changed(node=node, at=self._clock.monotonic() - START, kinds=kinds))

    def of(self, node: str) -> list[Ran]:
        return [r for r in self.cycles if r.node == node]


def run_pool_for(
    seconds: float, *, nodes: int, interval_s: float, faults: tuple[str, ...] = (), gpus: int = 2
) -> tuple[Pool, Recorder]:
    """Run a pool's schedule for ``seconds`` of fake time; return it (stopped) and its record."""
    clock = HorizonClock(START + seconds)
    recorder = Recorder(clock)
    settings = PoolSettings(
        nodes=nodes,
        gpus=gpus,
        interval_s=interval_s,
        faults=tuple(parse_fault("--fault", f, slot=i) for i, f in enumerate(faults)),
    )
    pool = Pool(settings, clock=clock, on_faults=recorder.on_faults, on_cycle=recorder.on_cycle)
    pool.start()
    reached = clock.reached.wait(10)
    pool.stop()
    assert reached, "the schedule did not run in fake time"
    return pool, recorder
