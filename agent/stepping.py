"""One GPU's step in a cycle: identify it, find who asks what of it, then cap,
release, leave it, or (observe mode) say what would have been written.

The rules (see :mod:`capwatch.agent.reconciling` for the cycle around them): a GPU whose
claims cannot be read is held as it is; an idle GPU is released if this agent
capped it, else left alone; with the unclaimed policy ``leave`` a busy GPU nobody
asks a cap for is treated the same way; everything else gets the cap the policy
resolves (:mod:`capwatch.agent.capping`), claimed in the ownership record before it is
written. Observe mode reaches every decision and writes nothing, the record
included. The stable reasons and messages a step's result carries are here too.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from capwatch.agent.attribution import Attributor
from capwatch.agent.capping import (
    NO_BOUNDS,
    CapBounds,
    CapDecision,
    Mode,
    UnclaimedPolicy,
    resolve_cap,
)
from capwatch.agent.dra.claims import ClaimCap, ClaimsSnapshot
from capwatch.agent.gpus import GpuBackend, GpuError, WriteOutcome, WriteResult
from capwatch.agent.ownership import OwnershipRecord, OwnershipStore
from capwatch.agent.pods import PodInfo, PodRef, PodSnapshot
from capwatch.agent.reports import GpuResult, Outcome, Reason

# -- what a step reports: stable reasons and messages -----------------------------------

WRITE_REASON = {
    WriteOutcome.FAILED: Reason.WRITE_FAILED,
    WriteOutcome.IDENTITY_MISMATCH: Reason.IDENTITY_MISMATCH,
    WriteOutcome.IDENTITY_UNCONFIRMED: Reason.IDENTITY_UNCONFIRMED,
}


def written_watts(written: WriteResult) -> int:
    return round((written.applied_milliwatts or 0) / 1000)


def write_message(what: str, written: WriteResult) -> str:
    if written.outcome is WriteOutcome.IDENTITY_MISMATCH:
        return f"{what} skipped: device identity changed"
    if written.outcome is WriteOutcome.IDENTITY_UNCONFIRMED:
        return f"{what} skipped: device identity could not be confirmed"
    cls = written.error_class.value if written.error_class else "unknown"
    return f"{what} failed: {cls}"


def failed_step(
    index: int,
    uuid: str | None,
    reason: Reason,
    exc: GpuError,
    what: str,
    *,
    owners: tuple[PodRef, ...] = (),
    process_count: int = 0,
) -> GpuResult:
    return GpuResult(
        index=index,
        uuid=uuid,
        outcome=Outcome.FAILED,
        reason=reason,
        message=f"{what}: {exc.error_class.value}",
        error_class=exc.error_class,
        owners=owners,
        process_count=process_count,
    )


def cap_message(watts: int | None, decision: CapDecision) -> str:
    """``capped at 450 W (claim ns/name)``; with a claim's problem when it was not taken."""
    source = decision.source.value
    if decision.claims and decision.problem is None:
        source = "claim " + ", ".join(str(c) for c in decision.claims)
    message = f"capped at {watts} W ({source})"
    return f"{message}: {decision.problem}" if decision.problem else message


def decided(
    index: int,
    uuid: str,
    decision: CapDecision,
    *,
    outcome: Outcome,
    reason: Reason,
    message: str,
    owners: tuple[PodRef, ...],
    process_count: int,
    applied_watts: int | None = None,
    intended_watts: int | None = None,
) -> GpuResult:
    """A step that reached a cap decision: written (enforced), or said (observed)."""
    return GpuResult(
        index=index,
        uuid=uuid,
        outcome=outcome,
        reason=reason,
        message=message,
        owners=owners,
        claims=decision.claims,
        claim_problem=decision.problem,
        requested_watts=decision.requested_watts,
        resolved_watts=decision.resolved_watts,
        applied_watts=applied_watts,
        intended_watts=intended_watts,
        cap_source=decision.source,
        safe_default_cause=decision.safe_default_cause,
        clamp=decision.clamp,
        process_count=process_count,
    )


# -- the step ---------------------------------------------------------------------------


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
    mode: Mode = Mode.ENFORCE
    unclaimed: UnclaimedPolicy = UnclaimedPolicy.SAFE_DEFAULT

    @property
    def observing(self) -> bool:
        return self.mode is Mode.OBSERVE


class GpuStep:
    """Runs one GPU's step at a time (the cycle thread; the shutdown sweep's releases)."""

    def __init__(
        self,
        *,
        backend: GpuBackend,
        store: OwnershipStore,
        attributor: Attributor,
        policy: Policy,
        release_unowned_idle: bool,
    ) -> None:
        self._backend = backend
        self._store = store
        self._attributor = attributor
        self._policy = policy
        # After an unreadable ownership record we cannot know what a previous
        # agent capped: restore the default on every idle GPU until one pass
        # over all of them succeeds (the cycle clears it).
        self.release_unowned_idle = release_unowned_idle
        # Set by the cycle thread around each write, read by the shutdown sweep
        # (one reference assignment: no lock needed).
        self.in_flight: InFlightWrite | None = None

    def step(
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
            if owned is None and not self.release_unowned_idle:
                return GpuResult(
                    index=index, uuid=uuid, outcome=Outcome.IDLE, reason=Reason.IDLE, message="idle"
                )
            return self.release(index, uuid, owned.owners if owned else ())
        if not claimed and self._leave_unclaimed(pods):
            if owned is None and not self.release_unowned_idle:
                return GpuResult(
                    index=index,
                    uuid=uuid,
                    outcome=Outcome.LEFT,
                    reason=Reason.UNCLAIMED,
                    message=f"left as it is: {self._unasked()}",
                    owners=owners,
                    process_count=len(pids),
                )
            # This agent's cap is there for an owner that left: it goes too.
            return self.release(
                index, uuid, owners, why=f"{self._unasked()}; default {{watts}} W restored"
            )
        if claimed:
            owners = tuple(sorted({*owners, *(pod for cap in claimed for pod in cap.pods)}))
        return self._cap(
            index,
            uuid,
            owned=owned,
            owners=owners,
            pods=pods,
            claimed=claimed,
            process_count=len(pids),
        )

    def _cap(
        self,
        index: int,
        uuid: str,
        *,
        owned: OwnershipRecord | None,
        owners: tuple[PodRef, ...],
        pods: list[PodInfo],
        claimed: Sequence[ClaimCap],
        process_count: int,
    ) -> GpuResult:
        """Decide the GPU's cap and write it (observe mode: say it)."""
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
                process_count=process_count,
            )
        decision = resolve_cap(
            pods,
            annotation_key=self._policy.annotation_key,
            safe_default_watts=self._policy.safe_default_watts,
            constraints=constraints,
            claims=claimed,
            bounds=self._policy.bounds,
        )
        if self._policy.observing:
            watts = round(decision.target_milliwatts / 1000)
            return decided(
                index,
                uuid,
                decision,
                outcome=Outcome.OBSERVED,
                reason=Reason.OBSERVED,
                message=f"would be {cap_message(watts, decision)}; observe mode",
                owners=owners,
                process_count=process_count,
                intended_watts=watts,
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
        self.in_flight = InFlightWrite(
            index=index, uuid=uuid, milliwatts=decision.target_milliwatts
        )
        try:
            written = self._backend.set_limit(
                index, uuid=uuid, milliwatts=decision.target_milliwatts
            )
        finally:
            self.in_flight = None
        if written.outcome not in (WriteOutcome.OK, WriteOutcome.FAILED):
            self._store.reinstate(uuid, owned)  # refused before writing: nothing changed
        enforced = decided(
            index,
            uuid,
            decision,
            outcome=Outcome.ENFORCED,
            reason=Reason.OK,
            message=cap_message(written_watts(written), decision),
            owners=owners,
            process_count=process_count,
            applied_watts=written_watts(written),
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

    def _leave_unclaimed(self, pods: Sequence[PodInfo]) -> bool:
        """Under the ``leave`` policy: no pod on the GPU carries the annotation at all
        (a pod that asks, validly or not, gets the cap policy as before)."""
        if self._policy.unclaimed is not UnclaimedPolicy.LEAVE:
            return False
        return not any(self._policy.annotation_key in pod.annotations for pod in pods)

    def _unasked(self) -> str:
        key = self._policy.annotation_key
        return f"no claim or {key} annotation asks a cap (unclaimed policy leave)"

    def release(
        self,
        index: int,
        uuid: str,
        owners: tuple[PodRef, ...],
        *,
        sweep: bool = False,
        why: str = "owner gone; default {watts} W restored",
    ) -> GpuResult:
        if self._policy.observing and not sweep:
            try:
                default = round(self._backend.constraints(index).default_milliwatts / 1000)
            except GpuError:
                default = None  # what it would write is still the default, whatever it is
            return GpuResult(
                index=index,
                uuid=uuid,
                outcome=Outcome.OBSERVED,
                reason=Reason.OBSERVED,
                message="would restore the default limit; observe mode",
                owners=owners,
                intended_watts=default,
            )
        if sweep:  # the shutdown sweep's own writes, on its own thread
            written = self._backend.restore_default(index, uuid=uuid)
        else:
            self.in_flight = InFlightWrite(index=index, uuid=uuid, milliwatts=None)
            try:
                written = self._backend.restore_default(index, uuid=uuid)
            finally:
                self.in_flight = None
        if written.ok:
            self._store.release(uuid)
            return GpuResult(
                index=index,
                uuid=uuid,
                outcome=Outcome.RELEASED,
                reason=Reason.RELEASED,
                message=why.format(watts=written_watts(written)),
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
