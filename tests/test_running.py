"""The run loop and the agent's lifecycle, on the simulator with real threads and time."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from pathlib import Path

import pytest

from capwatch.agent.attribution import Attributor, FsProcRoot
from capwatch.agent.capping import Mode
from capwatch.agent.departure import DepartureCheck
from capwatch.agent.hub import Hub
from capwatch.agent.lifecycle import Agent
from capwatch.agent.nudge import MIN_GAP_S, SETTLE_S, Nudge
from capwatch.agent.ownership import OwnershipStore
from capwatch.agent.reconciling import Reconciler
from capwatch.agent.running import AgentLoop, CycleThread
from capwatch.agent.sim.scenario import FaultOp, FaultSpec
from capwatch.agent.stepping import Policy
from capwatch.kit.clock import Clock, SystemClock
from capwatch.kit.readiness import ReadinessReason
from tests.contract.conftest import KEY, POD_A, PODS
from tests.contract.rigs import DEFAULT_W, SimRig
from tests.controller.virtual_time import LoopClock, VirtualTimeLoop
from tests.fakes.pods import StaticPodView

pytestmark = pytest.mark.asyncio


def build(
    tmp_path: Path,
    *,
    interval: float = 0.05,
    grace: float = 1.0,
    wrap=None,
    on_report=None,
    clock: Clock | None = None,
    nudge: Nudge | None = None,
    departure: DepartureCheck | None = None,
    mode: Mode = Mode.ENFORCE,
):
    rig = SimRig(tmp_path / "proc")
    pods = StaticPodView(PODS)
    clock = clock or SystemClock()
    reconciler = Reconciler(
        backend=wrap(rig.backend) if wrap else rig.backend,
        pods=pods,
        attributor=Attributor(FsProcRoot(tmp_path / "proc")),
        store=OwnershipStore(tmp_path / "state", clock=clock),
        clock=clock,
        policy=Policy(annotation_key=KEY, safe_default_watts=250, mode=mode),
        initial_device_count=3,
        listeners=rig.listeners,
    )
    hub = Hub(clock=clock, stale_after_s=3 * interval)
    thread = CycleThread()
    loop = AgentLoop(
        reconciler=reconciler,
        hub=hub,
        clock=clock,
        interval_s=interval,
        cycle_thread=thread,
        on_report=on_report,
        nudge=nudge,
    )
    agent = Agent(
        node_name="rig",
        interval_s=interval,
        backend=rig.backend,
        pods=pods,
        reconciler=reconciler,
        hub=hub,
        loop=loop,
        cycle_thread=thread,
        shutdown_grace_s=grace,
        departure=departure,
        observing=mode is Mode.OBSERVE,
    )
    return rig, pods, hub, agent


async def wait_until(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_readiness_goes_ready_after_the_first_good_cycle(tmp_path: Path):
    """Not ready before any cycle; ready right after the first enforced one."""
    rig, _, hub, agent = build(tmp_path)
    rig.run(0, {1001: POD_A.ref.uid})
    assert hub.readiness().reason is ReadinessReason.NO_CYCLE_YET
    stop = asyncio.Event()
    agent.start(stop)
    await wait_until(lambda: hub.state().sequence >= 1)
    assert hub.readiness().ready
    stop.set()
    await agent.stop()


async def test_a_raising_cycle_fails_at_once_and_the_loop_goes_on(tmp_path: Path):
    """An exception escaping reconcile_once publishes a failed cycle; the next one recovers."""
    _, pods, hub, agent = build(tmp_path)
    stop = asyncio.Event()
    agent.start(stop)
    await wait_until(lambda: hub.readiness().ready)
    pods.raise_on_snapshot(RuntimeError("bug"))
    await wait_until(lambda: hub.readiness().reason is ReadinessReason.CYCLE_FAILED)
    failed = hub.state().latest
    assert failed is not None
    assert "internal_error" in hub.readiness().text
    pods.raise_on_snapshot(None)
    await wait_until(lambda: hub.readiness().ready)
    assert hub.state().sequence > failed.sequence
    stop.set()
    await agent.stop()


class WatchedHang(threading.Event):
    """The sim world's interrupt event, noting when a hang starts waiting on it and when
    that wait ends: whether a hung call is inside its hang right now."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.left = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.entered.set()
        try:
            return super().wait(timeout)
        finally:
            self.left.set()


async def test_a_hung_cycle_goes_stale_without_freezing_the_event_loop(tmp_path: Path):
    """A cycle stuck in a backend call makes readiness stale while the event loop keeps
    running: the loop sees the hang begin and then STALE, both while the call is still
    inside its 30 s hang (a cycle run on the loop would hold it until the hang ended)."""
    rig, _, hub, agent = build(tmp_path, interval=0.05, grace=0.3)
    rig.run(0, {1001: POD_A.ref.uid})
    hang = rig.world.stop = WatchedHang()
    stop = asyncio.Event()
    agent.start(stop)
    await wait_until(lambda: hub.readiness().ready)
    rig.world.add_fault(FaultSpec(op=FaultOp.PROCESSES, gpu=0, hang_seconds=30))
    await wait_until(hang.entered.is_set)
    await wait_until(lambda: hub.readiness().reason is ReadinessReason.STALE)
    assert not hang.left.is_set(), "the loop ran only once the hang was over"
    stop.set()
    summary = await agent.stop()
    # The simulated hang is interruptible, so the stuck cycle ends and caps are restored.
    assert summary.restore_finished
    assert rig.limit_mw(0) == DEFAULT_W * 1000


async def test_stop_restores_owned_gpus_even_when_the_cycle_never_returns(tmp_path: Path):
    """An unkillable hang at shutdown: with a cycle known to be stuck in it (not merely
    given time to get there), the stop waits out its grace, then restores anyway."""
    rig, pods, hub, agent = build(tmp_path, interval=0.05, grace=0.3)
    rig.run(0, {1001: POD_A.ref.uid})
    stop = asyncio.Event()
    agent.start(stop)
    await wait_until(lambda: hub.readiness().ready)
    assert rig.limit_mw(0) == 350_000
    release = WatchedHang()
    pods.hold(release)  # not interruptible by the shutdown signal, like a hung NVML call
    await wait_until(release.entered.is_set)  # a cycle is stuck in it now
    stop.set()
    started = time.monotonic()
    summary = await agent.stop()
    # It waited out the grace (the cycle never returns); the upper bound is a hang
    # guard: a stop that waited for the cycle would never end.
    assert 0.3 <= time.monotonic() - started < 10
    assert not summary.cycle_finished
    assert summary.restore_finished
    assert rig.limit_mw(0) == DEFAULT_W * 1000
    release.set()


class _StuckAfterWriting:
    """A backend whose cap write on one GPU takes effect, then never returns (until
    released): a call stuck in the driver, which no shutdown signal interrupts."""

    def __init__(self, inner, index: int, release: threading.Event) -> None:
        self._inner, self._index, self._release = inner, index, release
        self.stuck = threading.Event()

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def set_limit(self, index: int, *, uuid: str, milliwatts: int):
        written = self._inner.set_limit(index, uuid=uuid, milliwatts=milliwatts)
        if index == self._index:
            self.stuck.set()
            self._release.wait(10)
        return written


async def test_a_cap_write_stuck_at_shutdown_is_restored_and_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """A GPU whose first cap write took effect but never returned is restored by the
    shutdown sweep (it was claimed before the write), and the stop names the write."""
    release = threading.Event()
    stuck: list[_StuckAfterWriting] = []

    def wrap(inner):
        stuck.append(_StuckAfterWriting(inner, 1, release))
        return stuck[0]

    rig, _, _, agent = build(tmp_path, interval=0.05, grace=0.3, wrap=wrap)
    rig.run(1, {1002: POD_A.ref.uid})
    stop = asyncio.Event()
    agent.start(stop)
    try:
        await wait_until(stuck[0].stuck.is_set)
        assert rig.limit_mw(1) == 350_000  # the write took effect; the call is stuck
        stop.set()
        summary = await agent.stop()
    finally:
        release.set()
    assert not summary.cycle_finished
    assert summary.in_flight is not None
    assert (summary.in_flight.index, summary.in_flight.milliwatts) == (1, 350_000)
    assert [r.index for r in summary.restored if r.outcome.value == "released"] == [1]
    assert rig.limit_mw(1) == DEFAULT_W * 1000
    assert any(
        "never returned and may still take effect" in r.getMessage() and "gpu=1" in r.getMessage()
        for r in caplog.records
    )


async def test_a_busy_event_loop_does_not_stretch_the_period(tmp_path: Path):
    """The interval counts from the end of each cycle: time the event loop spends elsewhere
    before it gets the report back (serving streams) is not added to the period. On
    virtual time (the loop's clock is the agent's), where a cycle takes no time, the
    period is exactly the interval; with the busy time added it would be 0.8 s."""

    def run_on_virtual_time() -> list[float]:
        loop = VirtualTimeLoop()
        starts: list[float] = []

        def busy(report) -> None:
            starts.append(report.started_monotonic)
            loop.spend(0.3)  # the loop is busy for 0.3 s after every cycle

        async def body() -> None:
            # The loop itself, not Agent.start: no other task may arm a timer while a
            # cycle runs on its thread (virtual time would jump past it).
            _, _, _, agent = build(tmp_path, interval=0.5, on_report=busy, clock=LoopClock())
            try:
                await agent.loop.run(asyncio.Event(), max_cycles=4)
            finally:
                agent._cycle_thread.close()

        try:
            loop.run_until_complete(body())
        finally:
            loop.close()
        return starts

    # A loop of its own on a thread, so this test's real loop is left alone.
    starts = await asyncio.to_thread(run_on_virtual_time)
    assert len(starts) == 4
    periods = [b - a for a, b in itertools.pairwise(starts)]
    assert periods == pytest.approx([0.5] * 3, abs=1e-9), periods


async def test_a_nudge_brings_the_next_cycle_forward_but_never_too_close(tmp_path: Path):
    """A watch's nudge (a claim allocated here, a pod bound here) right after a cycle makes
    the next one start MIN_GAP_S after it, not an interval later; one arriving during a
    cycle's settle time is in that cycle; without a nudge the interval holds. On virtual
    time, to the instant."""
    nudge = Nudge()

    def run_on_virtual_time() -> tuple[list[float], int]:
        loop = VirtualTimeLoop()
        starts: list[float] = []

        def seen(report) -> None:
            starts.append(report.started_monotonic)
            if len(starts) == 1:
                nudge()
                nudge()  # a burst: one early cycle
            if len(starts) == 2:
                loop.call_later(30.0, nudge)  # mid-interval: SETTLE_S later

        async def body() -> tuple[list[float], int]:
            _, _, _, agent = build(
                tmp_path, interval=60.0, on_report=seen, clock=LoopClock(), nudge=nudge
            )
            try:
                await agent.loop.run(asyncio.Event(), max_cycles=4)
            finally:
                agent._cycle_thread.close()
            return starts, agent.loop.early_cycles

        try:
            return loop.run_until_complete(body())
        finally:
            loop.close()

    starts, early = await asyncio.to_thread(run_on_virtual_time)
    periods = [b - a for a, b in itertools.pairwise(starts)]
    assert periods == pytest.approx([MIN_GAP_S, 30.0 + SETTLE_S, 60.0], abs=1e-9), periods
    assert early == 2
