"""What one GPU's step reports: a failed call, a write, a cap decision, in words.

Pure helpers of :mod:`agent.reconciling`: the stable messages and reasons a step's
:class:`~agent.reports.GpuResult` carries.
"""

from __future__ import annotations

from agent.capping import CapDecision
from agent.gpus import GpuError, WriteOutcome, WriteResult
from agent.pods import PodRef
from agent.reports import GpuResult, Outcome, Reason

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
