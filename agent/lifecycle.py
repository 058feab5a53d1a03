"""An assembled agent and its ordered start and stop.

Stop order (each step bounded so a hung NVML call cannot keep caps in place
forever): tell the running cycle to stop at its next GPU boundary; wait for it
up to the grace period; restore the default limit on every GPU this agent
owns and persist the record; close the pod view and the GPU library. The
readiness and serving steps that precede these belong to the server layer,
which calls :meth:`Agent.stop` after it has stopped serving.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from agent.gpus import GpuBackend
from agent.hub import Hub
from agent.podevents import PodEvents
from agent.pods import PodView
from agent.reconciling import InFlightWrite, Reconciler
from agent.reports import GpuResult
from agent.running import AgentLoop, CycleThread

log = logging.getLogger(__name__)

LOOP_TASK_NAME = "capwatch-reconcile-loop"


@dataclass(frozen=True, kw_only=True)
class ShutdownSummary:
    """What the stop sequence did, for logs and tests."""

    cycle_finished: bool  # False: the in-flight cycle was still hung at the deadline
    restored: tuple[GpuResult, ...]
    restore_finished: bool
    # The hung cycle's write, which may still land after the restore sweep.
    in_flight: InFlightWrite | None = None

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
        """Stop the loop, restore owned GPUs, close everything. Safe to call once."""
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
        restored, restore_finished = await self._restore()
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
        )

    async def _restore(self) -> tuple[tuple[GpuResult, ...], bool]:
        # The cycle thread may be stuck in a hung call: restore on a fresh daemon
        # thread so the sweep can go ahead, bounded by the grace period.
        future: Future[tuple[GpuResult, ...]] = Future()

        def work() -> None:
            try:
                future.set_result(self.reconciler.restore_all())
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting side
                future.set_exception(exc)

        threading.Thread(target=work, name="capwatch-restore", daemon=True).start()
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self._grace), True
        except TimeoutError:
            log.error("restoring default caps did not finish within %.1fs", self._grace)
            return (), False
        except Exception:
            log.exception("restoring default caps failed")
            return (), False
