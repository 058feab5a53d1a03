"""An assembled agent and its ordered start and stop.

Stop order (each step bounded so a hung NVML call cannot keep caps in place
forever): tell the running cycle to stop at its next GPU boundary; wait for it
up to the grace period; ask whether capwatch is leaving the node
(:mod:`capwatch.agent.departure`) and only then restore the default limit on every GPU
this agent owns and persist the record (staying, the caps are left for the
next agent; observe mode writes nothing); close the pod view and the GPU
library. The readiness and serving steps that precede these belong to the
server layer, which calls :meth:`Agent.stop` after it has stopped serving.

Leaving the node, and why restoring waits for it, is :mod:`capwatch.agent.departure`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import TypeVar

from capwatch.agent.departure import Departure, DepartureCheck, Standalone, staying_unknown
from capwatch.agent.gpus import GpuBackend
from capwatch.agent.hub import Hub
from capwatch.agent.podevents import PodEvents
from capwatch.agent.pods import PodView
from capwatch.agent.reconciling import Reconciler
from capwatch.agent.reports import GpuResult
from capwatch.agent.running import AgentLoop, CycleThread
from capwatch.agent.stepping import InFlightWrite

log = logging.getLogger(__name__)

LOOP_TASK_NAME = "capwatch-reconcile-loop"
# Three GETs, each under its own timeout: past this the caps stay (cannot tell).
DEPARTURE_TIMEOUT_S = 8.0

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class ShutdownSummary:
    """What the stop sequence did, for logs and tests."""

    cycle_finished: bool  # False: the in-flight cycle was still hung at the deadline
    restored: tuple[GpuResult, ...]
    restore_finished: bool
    # The hung cycle's write, which may still land after the restore sweep.
    in_flight: InFlightWrite | None = None
    # Whether capwatch is leaving the node, and why (None: observe mode, nothing to restore).
    departure: Departure | None = None

    @property
    def clean(self) -> bool:
        return (
            self.cycle_finished
            and self.restore_finished
            and not any(r.failed for r in self.restored)
        )


class Agent:
    def __init__(
        self,
        *,
        node_name: str,
        interval_s: float,
        backend: GpuBackend,
        pods: PodView,
        reconciler: Reconciler,
        hub: Hub,
        loop: AgentLoop,
        cycle_thread: CycleThread,
        shutdown_grace_s: float,
        cleanups: tuple[Callable[[], None], ...] = (),
        pod_events: PodEvents | None = None,
        departure: DepartureCheck | None = None,
        observing: bool = False,
    ) -> None:
        self.node_name = node_name
        self.interval_s = interval_s
        self.backend = backend
        self.pods = pods
        self.reconciler = reconciler
        self.hub = hub
        self.loop = loop
        self._cycle_thread = cycle_thread
        self._grace = shutdown_grace_s
        self._cleanups = cleanups
        self.pod_events = pod_events  # None: not posting Events (simulator, or turned off)
        self._departure: DepartureCheck = departure or Standalone()
        self._observing = observing  # observe mode: no write at all, the sweep included
        self._task: asyncio.Task[None] | None = None

    def start(self, stop: asyncio.Event, *, max_cycles: int | None = None) -> asyncio.Task[None]:
        """Start the reconcile loop as a named task; it sets ``stop`` if it dies."""
        task = asyncio.create_task(self.loop.run(stop, max_cycles=max_cycles), name=LOOP_TASK_NAME)

        def supervise(done: asyncio.Task[None]) -> None:
            if not done.cancelled() and done.exception() is not None:
                log.error("reconcile loop died", exc_info=done.exception())
            stop.set()

        task.add_done_callback(supervise)
        self._task = task
        return task

    def close(self) -> None:
        """Release everything without restoring caps: for an agent that never started.

        A start-up failure (a port in use, say) must not run the restore sweep:
        the agent enforced nothing, and restoring would undo what a previous
        agent's record still says it owns.
        """
        self._cycle_thread.close()
        self._close_all()

    def _close_all(self) -> None:
        for close in (self.pods.close, self.backend.close, *self._cleanups):
            try:
                close()
            except Exception:
                log.exception("error while closing %s", close)

    async def stop(self) -> ShutdownSummary:
        """Stop the loop, restore owned GPUs if leaving the node, close everything.
        Safe to call once."""
        self.reconciler.request_shutdown()
        cycle_finished = True
        if self._task is not None and not self._task.done():
            done, _ = await asyncio.wait({self._task}, timeout=self._grace)
            if not done:
                cycle_finished = False
                log.error(
                    "in-flight cycle did not finish within %.1fs; restoring anyway", self._grace
                )
                self._task.cancel()
        in_flight = None if cycle_finished else self.reconciler.in_flight_write
        departure = None
        restored: tuple[GpuResult, ...] = ()
        restore_finished = True
        if self._observing:
            log.info("shutdown: observe mode, nothing was written and nothing is restored")
        else:
            departure = await self._ask_departure()
            if departure.leaving:
                log.info("shutdown: leaving the node (%s); restoring defaults", departure.reason)
                restored, restore_finished = await self._restore()
            else:
                log.info("shutdown: staying (%s)", departure.reason)
        for result in restored:
            log.info(
                "shutdown restore gpu=%d uuid=%s outcome=%s reason=%s",
                result.index,
                result.uuid,
                result.outcome.value,
                result.reason.value,
            )
        if in_flight is not None:
            # Nothing can stop a call stuck in the driver: if it returns, its write
            # lands after the restore above. Say so, naming the GPU.
            log.error(
                "shutdown: a %s on gpu=%d uuid=%s never returned and may still take effect; "
                "check that GPU's power limit",
                "restore of the default limit"
                if in_flight.milliwatts is None
                else f"cap write of {in_flight.milliwatts} mW",
                in_flight.index,
                in_flight.uuid,
            )
        self._cycle_thread.close()
        self._close_all()
        return ShutdownSummary(
            cycle_finished=cycle_finished,
            restored=restored,
            restore_finished=restore_finished,
            in_flight=in_flight,
            departure=departure,
        )

    async def _ask_departure(self) -> Departure:
        try:
            check = self._departure.check
            return await _off_thread(check, "capwatch-departure", DEPARTURE_TIMEOUT_S)
        except TimeoutError:
            why = f"no answer within {DEPARTURE_TIMEOUT_S:g}s"
        except Exception as exc:  # a bug in a check must not decide for the restore
            log.exception("shutdown: the departure check failed")
            why = f"{type(exc).__name__}: {exc}"
        return staying_unknown(why)

    async def _restore(self) -> tuple[tuple[GpuResult, ...], bool]:
        # The cycle thread may be stuck in a hung call: restore on a fresh daemon
        # thread so the sweep can go ahead, bounded by the grace period.
        try:
            return (
                await _off_thread(self.reconciler.restore_all, "capwatch-restore", self._grace),
                True,
            )
        except TimeoutError:
            log.error("restoring default caps did not finish within %.1fs", self._grace)
            return (), False
        except Exception:
            log.exception("restoring default caps failed")
            return (), False


async def _off_thread(work: Callable[[], T], name: str, timeout_s: float) -> T:
    """``work()`` on a daemon thread of its own, awaited up to ``timeout_s``: a call
    stuck in a driver or a socket neither blocks the loop nor keeps the process alive."""
    future: Future[T] = Future()

    def run() -> None:
        # The awaiting side may have given up: its timeout cancels the future.
        try:
            result = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting side
            with contextlib.suppress(InvalidStateError):
                future.set_exception(exc)
        else:
            with contextlib.suppress(InvalidStateError):
                future.set_result(result)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)
