"""The readiness rule, as one pure function.

Ready iff the last completed cycle was enforced and finished less than
``stale_after`` seconds ago (by the monotonic clock). ``stale_after`` is
3 x interval: the loop sleeps *after* each cycle, so a healthy cycle may last
up to 2 x interval before readiness lapses. The staleness bound is what
catches a hung cycle, which nothing else can see: nothing fails, it simply
stops advancing.

A failed cycle's reason is ``state-unwritable`` when one of its failures is
that the ownership record could not be saved for several cycles in a row
(the agent still enforces, but a restarted one could not release its caps);
``cycle-failed`` otherwise. The detail is the cycle's failure summary either way.

The agent's gRPC health, the stream's readiness field and the ``/readyz`` shim
all call :func:`evaluate`, so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

STALE_MULTIPLIER = 3
# The failure summary's token for CycleFailureKind.STATE_UNWRITABLE (the shim
# sees only the summary, so the rule reads it from there).
STATE_UNWRITABLE_TOKEN = "state_unwritable"  # noqa: S105 - not a password


class ReadinessReason(str, Enum):
    READY = "ready"
    NO_CYCLE_YET = "no-cycle-yet"
    CYCLE_FAILED = "cycle-failed"
    STALE = "stale"
    STREAM_LOST = "stream-lost"
    STATE_UNWRITABLE = "state-unwritable"


@dataclass(frozen=True, kw_only=True)
class Readiness:
    ready: bool
    reason: ReadinessReason
    # Seconds since the last enforced cycle finished; None if none ever did.
    last_good_age_s: float | None
    detail: str = ""

    @property
    def text(self) -> str:
        """The short human form, e.g. ``cycle-failed: gpu0:write_failed``."""
        return f"{self.reason.value}: {self.detail}" if self.detail else self.reason.value


def stale_after(interval_s: float) -> float:
    return STALE_MULTIPLIER * interval_s


def evaluate(
    *,
    last_cycle_enforced: bool | None,
    last_cycle_age_s: float | None,
    last_good_age_s: float | None,
    stale_after_s: float,
    failure_summary: str = "",
) -> Readiness:
    """Apply the rule. ``last_cycle_*`` are None before any cycle completed."""
    if last_cycle_enforced is None or last_cycle_age_s is None:
        return Readiness(
            ready=False, reason=ReadinessReason.NO_CYCLE_YET, last_good_age_s=last_good_age_s
        )
    # Staleness first: a hung agent whose last cycle failed is stale, not merely
    # failed, and every consumer (device health too) must hear that it is stale.
    if last_cycle_age_s >= stale_after_s:
        return Readiness(
            ready=False,
            reason=ReadinessReason.STALE,
            last_good_age_s=last_good_age_s,
            detail=f"no cycle completed for {last_cycle_age_s:.1f}s (bound {stale_after_s:g}s)",
        )
    if not last_cycle_enforced:
        unwritable = STATE_UNWRITABLE_TOKEN in failure_summary.split(",")
        return Readiness(
            ready=False,
            reason=ReadinessReason.STATE_UNWRITABLE if unwritable else ReadinessReason.CYCLE_FAILED,
            last_good_age_s=last_good_age_s,
            detail=failure_summary,
        )
    return Readiness(ready=True, reason=ReadinessReason.READY, last_good_age_s=last_good_age_s)
