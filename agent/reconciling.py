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
unless this agent capped them earlier: then they are released. The per-GPU
fold never short-circuits. A shutdown request short-circuits the cycle and
returns the fold so far: a clean prefix stays enforced, an earlier failure
stays a failure.

Persisting the ownership record (see :mod:`agent.ownership`): a claim that
changes the record is saved before its write; everything else is saved as
the cycle ends, on every path (an abort, a shutdown short-circuit). A save
that fails is retried and does not fail the cycle, unless the record has
gone unsaved for ``UNSAVED_CYCLES_LIMIT`` cycles in a row: then the cycle
fails with ``state_unwritable`` until a save succeeds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from agent.attribution import Attributor
from agent.capping import NO_BOUNDS, CapBounds, resolve_cap
from agent.dra.claims import ClaimsSnapshot, ClaimView, NoClaims
from agent.folding import CycleBuilder
from agent.forgetting import ForgetRequests
from agent.gpus import GpuBackend, GpuError, WriteOutcome
from agent.health.faults import FaultTracker
from agent.health.telemetry import NO_READINGS
from agent.ownership import UNSAVED_CYCLES_LIMIT, OwnershipStore
from agent.pods import PodInfo, PodRef, PodSnapshot, PodView
from agent.reports import (
    AbortReason,
    CycleFailureKind,
    CycleReport,
    GpuResult,
    Outcome,
    Reason,
)
from agent.results import WRITE_REASON, cap_message, failed_step, write_message, written_watts
from kit.clock import Clock
from kit.errors import PodViewError

log = logging.getLogger(__name__)


class CycleListener(Protocol):
    """Told when a cycle begins and when the agent is stopping (the simulator uses it)."""

    def begin_cycle(self, sequence: int) -> None: ...

    def interrupt(self) -> None: ...


@dataclass(frozen=True, kw_only=True)
class InFlightWrite:
    """A power-limit write the cycle started and has not seen return."""

    index: int
    uuid: str
    milliwatts: int | None  # None: restoring the default


@dataclass(frozen=True, kw_only=True)
class Policy:
    annotation_key: str
    safe_default_watts: int
    bounds: CapBounds = NO_BOUNDS


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
        self._attributor = attributor
        self._store = store
        self._clock = clock
        self._policy = policy
        self._device_count = initial_device_count
        # After an unreadable ownership record we cannot know what a previous
        # agent capped: restore the default on every idle GPU until one pass
        # over all of them succeeds.
        self._release_unowned_idle = release_unowned_idle
        self._listeners = tuple(listeners)
        self._forget = forget  # operators' requests to forget vanished GPUs
        self._faults = faults or FaultTracker(wall=clock.wall, monotonic=clock.monotonic)
        # Set by the cycle thread around each write, read by the shutdown sweep
        # (one reference assignment: no lock needed).
        self._in_flight: InFlightWrite | None = None
        self._sequence = 0
        self._shutdown = threading.Event()
        self._unsaved_cycles = 0  # cycles in a row that ended with the record not saved

    @property
    def in_flight_write(self) -> InFlightWrite | None:
        """The cycle's write that has not returned, if one is under way (a hung call)."""
        return self._in_flight

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
        cycle = CycleBuilder(sequence=sequence, clock=self._clock)
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
            self._release_unowned_idle = False

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
        result = self._step(index, snapshot, claims, seen)
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

    def _step(
        self, index: int, snapshot: PodSnapshot, claims: ClaimsSnapshot, seen: set[str]
    ) -> GpuResult:
        try:
            uuid = self._backend.uuid(index)
        except GpuError as exc:
            return failed_step(index, None, Reason.UUID_READ_FAILED, exc, "UUID read failed")
        seen.add(uuid)

        try:
            pids = self._backend.processes(index)
        except GpuError as exc:
            return failed_step(index, uuid, Reason.PROCESS_LIST_FAILED, exc, "process list failed")

        owned = self._store.get(uuid)
        # A claim's cap applies from its allocation, before any process runs.
        claimed = claims.for_gpu(uuid)
        owners, pods = self._owners(pids, snapshot) if pids else ((), [])
        if not claimed:
            # Fail closed: a claim of a pod on (or owning) this GPU cannot be read or
            # resolved, so what it asks of this GPU is unknown. Leave the GPU as it is.
            recorded = owned.owners if owned is not None else ()
            held = claims.hold(pod.uid for pod in (*recorded, *owners))
            if held is not None:
                return GpuResult(
                    index=index,
                    uuid=uuid,
                    outcome=Outcome.FAILED,
                    reason=Reason.CLAIM_HELD,
                    message=f"cap left as it is: {held.message()}",
                    owners=tuple(sorted({*recorded, *owners})),
                    process_count=len(pids),
                )
        if not pids and not claimed:
            if owned is None and not self._release_unowned_idle:
                return GpuResult(
                    index=index, uuid=uuid, outcome=Outcome.IDLE, reason=Reason.IDLE, message="idle"
                )
            return self._release(index, uuid, owned.owners if owned else ())

        if claimed:
            owners = tuple(sorted({*owners, *(pod for cap in claimed for pod in cap.pods)}))
        try:
            constraints = self._backend.constraints(index)
        except GpuError as exc:
            return failed_step(
                index,
                uuid,
                Reason.CONSTRAINTS_READ_FAILED,
                exc,
                "power constraints read failed",
                owners=owners,
                process_count=len(pids),
            )
        decision = resolve_cap(
            pods,
            annotation_key=self._policy.annotation_key,
            safe_default_watts=self._policy.safe_default_watts,
            constraints=constraints,
            claims=claimed,
            bounds=self._policy.bounds,
        )
        # Claimed before writing: a write that fails (a timeout, say), hangs, or
        # is cut short by a shutdown may still take effect, and what the record
        # holds is what a release and the shutdown sweep restore. Restoring a
        # default that was never changed is harmless.
        if self._store.claim(
            uuid=uuid, index=index, owners=owners, target_milliwatts=decision.target_milliwatts
        ):
            # On disk before the write: a crash right after it must find the claim.
            # A failed save does not stop the write (see _save).
            self._store.flush()
        self._in_flight = InFlightWrite(
            index=index, uuid=uuid, milliwatts=decision.target_milliwatts
        )
        try:
            written = self._backend.set_limit(
                index, uuid=uuid, milliwatts=decision.target_milliwatts
            )
        finally:
            self._in_flight = None
        if written.outcome not in (WriteOutcome.OK, WriteOutcome.FAILED):
            self._store.reinstate(uuid, owned)  # refused before writing: nothing changed
        enforced = GpuResult(
            index=index,
            uuid=uuid,
            outcome=Outcome.ENFORCED,
            reason=Reason.OK,
            message=cap_message(written_watts(written), decision),
            owners=owners,
            claims=decision.claims,
            claim_problem=decision.problem,
            requested_watts=decision.requested_watts,
            resolved_watts=decision.resolved_watts,
            applied_watts=written_watts(written),
            cap_source=decision.source,
            safe_default_cause=decision.safe_default_cause,
            clamp=decision.clamp,
            process_count=len(pids),
        )
        if written.ok:
            return enforced
        return replace(
            enforced,
            outcome=Outcome.FAILED,
            reason=WRITE_REASON[written.outcome],
            message=write_message("cap write", written),
            error_class=written.error_class,
            applied_watts=None,
        )

    def _release(
        self, index: int, uuid: str, owners: tuple[PodRef, ...], *, sweep: bool = False
    ) -> GpuResult:
        if sweep:  # the shutdown sweep's own writes, on its own thread
            written = self._backend.restore_default(index, uuid=uuid)
        else:
            self._in_flight = InFlightWrite(index=index, uuid=uuid, milliwatts=None)
            try:
                written = self._backend.restore_default(index, uuid=uuid)
            finally:
                self._in_flight = None
        if written.ok:
            self._store.release(uuid)
            return GpuResult(
                index=index,
                uuid=uuid,
                outcome=Outcome.RELEASED,
                reason=Reason.RELEASED,
                message=f"owner gone; default {written_watts(written)} W restored",
                applied_watts=written_watts(written),
                owners=owners,
            )
        deferred = written.outcome is not WriteOutcome.FAILED
        return GpuResult(
            index=index,
            uuid=uuid,
            outcome=Outcome.FAILED,
            reason=Reason.RELEASE_DEFERRED if deferred else Reason.RELEASE_FAILED,
            message=write_message("release", written),
            error_class=written.error_class,
            owners=owners,
        )

    def _owners(
        self, pids: Iterable[int], snapshot: PodSnapshot
    ) -> tuple[tuple[PodRef, ...], list[PodInfo]]:
        pods: dict[str, PodInfo] = {}
        for uid in self._attributor.pod_uids(pids).values():
            if uid is None or uid in pods:
                continue
            # A pod the view does not know (yet) still owns the GPU; with no
            # annotation to read, the policy gives it the safe default.
            pods[uid] = snapshot.get(uid) or PodInfo(ref=PodRef(namespace="", name="", uid=uid))
        infos = sorted(pods.values(), key=lambda p: p.ref)
        return tuple(p.ref for p in infos), infos

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
                results.append(self._release(found, uuid, record.owners, sweep=True))
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
