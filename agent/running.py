"""The run loop: cycles on a dedicated thread, published into the hub.

NVML calls and file reads block, and a hung NVML call cannot be interrupted,
so cycles never run on the asyncio event loop the gRPC server shares: they run
on one dedicated daemon thread. A hung cycle then freezes only itself; the
event loop goes on serving, and the hub's readiness goes stale, which is
exactly what the staleness bound is for.

The loop sleeps *after* each cycle, from the moment it finished (period =
interval + cycle time, however busy the event loop is meanwhile), never
exits on a failed cycle, and turns a cycle that raised into a failed report,
so readiness drops on the next poll rather than after the staleness bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from capwatch.agent.folding import crashed_report
from capwatch.agent.hub import Hub
from capwatch.agent.nudge import MIN_GAP_S, SETTLE_S, Nudge
from capwatch.agent.reconciling import Reconciler
from capwatch.agent.reports import CycleReport
from capwatch.kit.clock import Clock

log = logging.getLogger(__name__)

T = TypeVar("T")


class CycleThread:
    """One long-lived daemon thread that runs submitted callables in order.

    A daemon thread, not a ThreadPoolExecutor: the interpreter joins executor
    threads at exit, so one hung NVML call would block the agent's exit forever.
    """

    def __init__(self, name: str = "capwatch-cycle") -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], object], Future[object]] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        self._jobs.put((fn, future))  # type: ignore[arg-type]
        return future

    def close(self) -> None:
        """Let the thread end after its current job (it is a daemon if that job hangs)."""
        self._jobs.put(None)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting side
                future.set_exception(exc)


class AgentLoop:
    """Runs ``reconcile_once`` every ``interval_s`` and publishes each report."""

    def __init__(
        self,
        *,
        reconciler: Reconciler,
        hub: Hub,
        clock: Clock,
        interval_s: float,
        cycle_thread: CycleThread,
        on_report: Callable[[CycleReport], None] | None = None,
        nudge: Nudge | None = None,
    ) -> None:
        self._reconciler = reconciler
        self._hub = hub
        self._clock = clock
        self._interval_s = interval_s
        self._thread = cycle_thread
        self._on_report = on_report
        self._nudge = nudge
        self.cycles = 0
        self.early_cycles = 0

    async def run(self, stop: asyncio.Event, *, max_cycles: int | None = None) -> None:
        """Cycle until ``stop`` is set (or ``max_cycles`` have run)."""
        nudged = self._nudge.bind() if self._nudge is not None else asyncio.Event()
        while not stop.is_set():
            report = await self.cycle_once()
            self.cycles += 1
            if max_cycles is not None and self.cycles >= max_cycles:
                return
            await self._pause(stop, nudged, report.finished_monotonic)

    async def _pause(self, stop: asyncio.Event, nudged: asyncio.Event, finished: float) -> None:
        """Until the interval is up (it runs from the end of the cycle, not from when
        this loop got the report back: a loop busy serving thousands of streams must
        not stretch the period), or sooner when nudged (agent/nudge.py)."""
        while not stop.is_set():
            left = self._interval_s - (self._clock.monotonic() - finished)
            if left <= 0:
                return
            woken = await _first(stop, nudged, within=left)
            if woken is not nudged:
                return
            nudged.clear()
            gap = MIN_GAP_S - (self._clock.monotonic() - finished)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(SETTLE_S, gap))
            nudged.clear()  # what arrived while settling is in the cycle about to run
            self.early_cycles += 1
            return

    async def cycle_once(self) -> CycleReport:
        """Run one cycle on the cycle thread, publish it, and return it."""
        started_wall, started_mono = self._clock.wall(), self._clock.monotonic()
        sequence_before = self._reconciler.sequence
        try:
            report = await asyncio.wrap_future(self._thread.submit(self._reconcile_and_publish))
        except Exception as exc:
            log.exception("cycle raised; reporting it as failed")
            sequence = self._reconciler.sequence
            if sequence == sequence_before:  # raised before claiming a number
                sequence = self._reconciler.next_sequence()
            report = crashed_report(
                sequence=sequence,
                started_wall=started_wall,
                started_monotonic=started_mono,
                clock=self._clock,
                exc=exc,
            )
            self._hub.publish(report)
        _log_report(report)
        if self._on_report is not None:
            self._on_report(report)
        return report

    def _reconcile_and_publish(self) -> CycleReport:
        # Published from the cycle thread: a busy event loop (thousands of
        # streams being served) must not delay the cycle's publication.
        report = self._reconciler.reconcile_once()
        self._hub.publish(report)
        return report


async def _first(*events: asyncio.Event, within: float) -> asyncio.Event | None:
    """The first of ``events`` to be set within ``within`` seconds, or None."""
    waiters = {asyncio.ensure_future(event.wait()): event for event in events}
    try:
        done, _ = await asyncio.wait(waiters, timeout=within, return_when="FIRST_COMPLETED")
    finally:
        for waiter in waiters:
            waiter.cancel()
    return next((waiters[w] for w in waiters if w in done), None)


def _log_report(report: CycleReport) -> None:
    level = logging.INFO if report.enforced else logging.WARNING
    log.log(
        level,
        "cycle seq=%d enforced=%s duration_ms=%.1f gpus=%d failures=%s",
        report.sequence,
        str(report.enforced).lower(),
        report.duration_s * 1000,
        len(report.gpus),
        report.failure_summary or "-",
    )
