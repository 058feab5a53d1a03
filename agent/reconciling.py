"""One reconcile cycle: read the GPUs and the pods, write the caps, report honestly.

The contract (the readiness proposal's §1): a cycle is *enforced* iff every
action it was required to take completed and every input it depended on was
obtained. Each failure class below fails it, none is silently absorbed:

* device-count refresh failed (the last known count is used, the cycle fails);
* pod view not synced (the cycle aborts before touching any GPU);
* per GPU: UUID read, process list or constraints read failed; a write whose
  outcome is not OK (a clean return is not success); a write refused because
  the device's identity changed or could not be confirmed; a release (restore
  default on a GPU whose owners left) that failed or had to be deferred;
* an unexpected exception (per GPU it fails that GPU, the fold goes on).

Idle GPUs (no compute processes) are never written and count neither way,
unless this agent capped them earlier: then they are released; one GPU's step,
the unclaimed policy and observe mode included, is :mod:`capwatch.agent.stepping`'s.
The per-GPU fold never short-circuits. A shutdown request short-circuits the cycle and
returns the fold so far: a clean prefix stays enforced, an earlier failure
stays a failure.

Persisting the ownership record (see :mod:`capwatch.agent.ownership`): a claim that
changes the record is saved before its write; everything else is saved as
the cycle ends, on every path (an abort, a shutdown short-circuit). A save
that fails is retried and does not fail the cycle, unless the record has
gone unsaved for ``UNSAVED_CYCLES_LIMIT`` cycles in a row: then the cycle
fails with ``state_unwritable`` until a save succeeds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from capwatch.agent.attribution import Attributor
from capwatch.agent.dra.claims import ClaimsSnapshot, ClaimView, NoClaims
from capwatch.agent.folding import CycleBuilder
from capwatch.agent.forgetting import ForgetRequests
from capwatch.agent.gpus import GpuBackend, GpuError
from capwatch.agent.health.faults import FaultTracker
from capwatch.agent.health.telemetry import NO_READINGS
from capwatch.agent.ownership import UNSAVED_CYCLES_LIMIT, OwnershipStore
from capwatch.agent.pods import PodSnapshot, PodView
from capwatch.agent.reports import (
    AbortReason,
    CycleFailureKind,
    CycleReport,
    GpuResult,
    Outcome,
    Reason,
)
from capwatch.agent.stepping import GpuStep, InFlightWrite, Policy
from capwatch.kit.clock import Clock
from capwatch.kit.errors import PodViewError

log = logging.getLogger(__name__)


class CycleListener(Protocol):
    """Told when a cycle begins and when the agent is stopping (the simulator uses it)."""

    def begin_cycle(self, sequence: int) -> None: ...

    def interrupt(self) -> None: ...


class Reconciler:
    """Owns the per-cycle state; ``reconcile_once`` runs on one thread at a time."""

    def __init__(
        self,
        *,
        backend: GpuBackend,
        pods: PodView,
        attributor: Attributor,
        store: OwnershipStore,
        clock: Clock,
        policy: Policy,
        initial_device_count: int,
        release_unowned_idle: bool = False,
        listeners: Sequence[CycleListener] = (),
        forget: ForgetRequests | None = None,
        faults: FaultTracker | None = None,
        claims: ClaimView | None = None,
    ) -> None:
        self._backend = backend
        self._pods = pods
        self._claims: ClaimView = claims or NoClaims()
        self._store = store
        self._clock = clock
        self._policy = policy
        self._device_count = initial_device_count
        self._steps = GpuStep(
            backend=backend,
            store=store,
            attributor=attributor,
            policy=policy,
            release_unowned_idle=release_unowned_idle,
        )
        self._listeners = tuple(listeners)
        self._forget = forget  # operators' requests to forget vanished GPUs
        self._faults = faults or FaultTracker(wall=clock.wall, monotonic=clock.monotonic)
        self._sequence = 0
        self._shutdown = threading.Event()
        self._unsaved_cycles = 0  # cycles in a row that ended with the record not saved

    @property
    def in_flight_write(self) -> InFlightWrite | None:
        """The cycle's write that has not returned, if one is under way (a hung call)."""
        return self._steps.in_flight

    @property
    def sequence(self) -> int:
        """The sequence number of the cycle started last (0 before any)."""
        return self._sequence

    def request_shutdown(self) -> None:
        """Make the running (and any later) cycle stop at its next GPU boundary."""
        self._shutdown.set()
        for listener in self._listeners:
            listener.interrupt()

    def next_sequence(self) -> int:
        self._sequence += 1
        return self._sequence

    def reconcile_once(self) -> CycleReport:
        """Run one cycle and return its report. Raises only on programming errors."""
        sequence = self.next_sequence()
        cycle = CycleBuilder(sequence=sequence, clock=self._clock, observe=self._policy.observing)
        for listener in self._listeners:
            listener.begin_cycle(sequence)
        failures_before = self._store.flush_failures
        try:
            self._reconcile(cycle)
        finally:
            # Every path saves, an aborted cycle's included: claims taken and
            # releases made must reach the disk whatever stopped the cycle.
            self._save(cycle, failures_before)
        return cycle.finish()

    def _reconcile(self, cycle: CycleBuilder) -> None:
        """The cycle's fold, into ``cycle``."""
        if self._shutdown.is_set():
            cycle.interrupted = True
            return

        try:
            self._device_count = self._backend.device_count()
        except GpuError as exc:
            cycle.fail(
                CycleFailureKind.DEVICE_COUNT_FAILED,
                f"device count refresh failed ({exc.error_class.value}); "
                f"keeping last count {self._device_count}",
            )

        # Drained whatever happens next: an aborted cycle must not let events pile up.
        cycle.events = self._backend.drain_events()
        self._faults.take_events(cycle.events)

        try:
            snapshot = self._pods.snapshot()
            claims = self._claims.snapshot(snapshot)
        except PodViewError as exc:
            cycle.fail(CycleFailureKind.POD_VIEW_NOT_SYNCED, f"pod view not synced: {exc}")
            cycle.abort_reason = AbortReason.POD_VIEW_NOT_SYNCED
            return
        for problem in claims.problems:
            cycle.fail(CycleFailureKind(problem.kind.value), problem.message())

        seen: set[str] = set()
        all_idle_released = True
        for index in range(self._device_count):
            if self._shutdown.is_set():
                cycle.interrupted = True
                return
            try:
                result = self._reconcile_gpu(index, snapshot, claims, seen)
            except Exception as exc:  # the fold must go on to the next GPU
                log.exception("unexpected error reconciling gpu=%d", index)
                result = GpuResult(
                    index=index,
                    uuid=None,
                    outcome=Outcome.FAILED,
                    reason=Reason.INTERNAL_ERROR,
                    message=f"internal error: {type(exc).__name__}",
                )
            all_idle_released &= not result.failed
            cycle.add(result)

        if self._forget is not None:
            self._forget.apply(self._store, seen)
        for record in self._store.records().values():
            if record.uuid not in seen:
                cycle.add(
                    GpuResult(
                        index=record.index,
                        uuid=record.uuid,
                        outcome=Outcome.FAILED,
                        reason=Reason.RELEASE_DEFERRED,
                        message="GPU capped by this agent is not visible; its cap was not released",
                        owners=record.owners,
                        # A lost GPU's fault must survive this result: it comes after its
                        # failed step in the cycle, and the device table keeps the last.
                        faults=self._faults.active(record.uuid),
                    )
                )
        if all_idle_released:
            self._steps.release_unowned_idle = False

    def _save(self, cycle: CycleBuilder, failures_before: int) -> None:
        saved = self._store.flush()
        self._unsaved_cycles = 0 if saved else self._unsaved_cycles + 1
        cycle.saved(
            unsaved_cycles=self._unsaved_cycles,
            save_failures=self._store.flush_failures - failures_before,
        )
        if self._unsaved_cycles >= UNSAVED_CYCLES_LIMIT:
            cycle.fail(
                CycleFailureKind.STATE_UNWRITABLE,
                f"ownership record not saved for {self._unsaved_cycles} cycles "
                f"({self._store.last_flush_error}); a restarted agent could not release "
                "what this one capped",
            )

    def _reconcile_gpu(
        self, index: int, snapshot: PodSnapshot, claims: ClaimsSnapshot, seen: set[str]
    ) -> GpuResult:
        """The GPU's step, then the device's own health after it."""
        result = self._steps.step(index, snapshot, claims, seen)
        # Read after the write: the enforced limit read back shows what took.
        readings = self._backend.readings(index) if result.uuid is not None else NO_READINGS
        faults = self._faults.observe(
            index,
            uuid=result.uuid,
            readings=readings,
            error_class=result.error_class,
            uuid_failed=result.reason is Reason.UUID_READ_FAILED,
        )
        if result.uuid is None:
            # A GPU that does not answer (lost) is still the device it was: named by the
            # UUID it last answered with, and by its slice's name, so the streams, the DRA
            # mirror and the controller keep naming the same device through the fault.
            known = self._faults.uuid_at(index)
            dra = None if known is None else claims.names.get(known)
            return replace(result, uuid=known, dra_device=dra, faults=faults, readings=None)
        # One replace for everything added after the step: it costs about as much as
        # the GPU's whole cap decision.
        return replace(
            result,
            faults=faults,
            readings=readings,
            dra_device=claims.names.get(result.uuid, result.dra_device),
        )

    def restore_all(self) -> tuple[GpuResult, ...]:
        """Restore the default limit on every GPU this agent owns (at shutdown)."""
        records = self._store.records()
        if not records:
            return ()
        by_uuid: dict[str, int] = {}
        for index in range(self._device_count):
            try:
                by_uuid[self._backend.uuid(index)] = index
            except GpuError as exc:
                log.warning("shutdown: uuid read failed gpu=%d error=%s", index, exc)
        results = []
        for uuid, record in records.items():
            found = by_uuid.get(uuid)
            if found is None:
                results.append(
                    GpuResult(
                        index=record.index,
                        uuid=uuid,
                        outcome=Outcome.FAILED,
                        reason=Reason.RELEASE_DEFERRED,
                        message="not visible at shutdown; cap left in place",
                        owners=record.owners,
                    )
                )
                continue
            try:
                results.append(self._steps.release(found, uuid, record.owners, sweep=True))
            except Exception as exc:  # the sweep visits every GPU whatever one does
                log.exception("shutdown: restoring gpu=%d uuid=%s raised", found, uuid)
                results.append(
                    GpuResult(
                        index=found,
                        uuid=uuid,
                        outcome=Outcome.FAILED,
                        reason=Reason.INTERNAL_ERROR,
                        message=f"restore raised {type(exc).__name__}; cap may be in place",
                        owners=record.owners,
                    )
                )
        self._store.flush()
        return tuple(results)
