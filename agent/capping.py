"""Cap policy: from the claims and pods on a GPU to the one power limit to write.

The precedence (docs/claims.md):

1. **Claims first.** When ResourceClaims allocated the GPU to pods of this node
   and at least one of them asks a cap (a ``capwatch.io`` PowerCap config), the
   claims decide, whatever the pods' annotations say: one claim gives its value;
   several that agree give that value; a claim whose PowerCap is invalid, or
   claims that disagree, give ``safe_default_watts`` (the claims named).
2. **Else annotations**, as before claims existed: one annotated pod gives its
   value; several pods that all carry the same valid value give that value;
   anything else (missing, invalid, disagreeing, or no known pod at all) gives
   ``safe_default_watts``.

The result is then bounded by the cluster's floor and ceiling (``--cap-floor-watts``,
``--cap-ceiling-watts``: every source, the safe default included), then clamped to
the GPU's settable range; the clamp that decided the value written is recorded
(the GPU's, when it moved the value again). Pure functions only: no I/O, never
raises on annotation or parameter content.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from capwatch.agent.dra.claims import ClaimCap, ClaimRef
from capwatch.agent.gpus import MAX_REQUEST_WATTS, PowerConstraints
from capwatch.agent.pods import PodInfo
from capwatch.agent.reports import CapSource, ClampDirection, SafeDefaultCause

DEFAULT_ANNOTATION_KEY = "capwatch.io/gpu-power-limit"

# ASCII digits only: int() would also accept "1_000", "٣٠٠" and "+300".
_WATTS = re.compile(r"[0-9]{1,9}")


def parse_watts(value: str | None) -> int | None:
    """Parse an annotation value as a positive integer wattage; None if invalid."""
    if value is None:
        return None
    text = value.strip()
    if not _WATTS.fullmatch(text):
        return None
    watts = int(text)
    if watts <= 0 or watts > MAX_REQUEST_WATTS:
        return None
    return watts


class Mode(str, Enum):
    """Whether cycles write (``enforce``) or only say what they would write (``observe``)."""

    ENFORCE = "enforce"
    OBSERVE = "observe"


class UnclaimedPolicy(str, Enum):
    """What a busy GPU nobody asks a cap for gets: the safe default, or its limit left."""

    SAFE_DEFAULT = "safeDefault"
    LEAVE = "leave"


@dataclass(frozen=True, kw_only=True)
class CapBounds:
    """The cluster's floor and ceiling for every cap, in watts (None: no bound)."""

    floor_watts: int | None = None
    ceiling_watts: int | None = None

    def __post_init__(self) -> None:
        floor, ceiling = self.floor_watts, self.ceiling_watts
        if floor is not None and ceiling is not None and floor > ceiling:
            raise ValueError("the floor must not be above the ceiling")

    def apply(self, watts: int) -> tuple[int, ClampDirection]:
        if self.ceiling_watts is not None and watts > self.ceiling_watts:
            return self.ceiling_watts, ClampDirection.LOWERED_TO_CEILING
        if self.floor_watts is not None and watts < self.floor_watts:
            return self.floor_watts, ClampDirection.RAISED_TO_FLOOR
        return watts, ClampDirection.NONE


NO_BOUNDS = CapBounds()


@dataclass(frozen=True, kw_only=True)
class CapDecision:
    """What to write on one GPU, and why."""

    requested_watts: int | None  # what the pods asked for, when they asked for one value
    resolved_watts: int  # after the policy, before clamping
    target_milliwatts: int  # after clamping: what is written
    source: CapSource
    safe_default_cause: SafeDefaultCause | None
    clamp: ClampDirection
    claims: tuple[ClaimRef, ...] = ()  # the claims that decided (rule 1)
    problem: str | None = None  # why a claim's PowerCap was not taken, naming it


def resolve_cap(
    pods: Sequence[PodInfo],
    *,
    annotation_key: str,
    safe_default_watts: int,
    constraints: PowerConstraints,
    claims: Sequence[ClaimCap] = (),
    bounds: CapBounds = NO_BOUNDS,
) -> CapDecision:
    """Apply the cap policy to one GPU: the caps its claims ask (claims of pods of this
    node), else the annotations of the pods whose processes run on it."""
    if claims:
        return _from_claims(
            claims, safe_default_watts=safe_default_watts, constraints=constraints, bounds=bounds
        )
    requested: int | None = None
    cause: SafeDefaultCause | None = None
    if not pods:
        cause = SafeDefaultCause.NO_POD
    else:
        raw = [pod.annotations.get(annotation_key) for pod in pods]
        values = [parse_watts(v) for v in raw]
        if any(v is None for v in raw):
            cause = SafeDefaultCause.MISSING
        elif any(v is None for v in values):
            cause = SafeDefaultCause.INVALID
        elif len(set(values)) > 1:
            cause = SafeDefaultCause.DISAGREE
        else:
            requested = values[0]

    if requested is not None:
        source = CapSource.ANNOTATION if len(pods) == 1 else CapSource.AGREED
        resolved = requested
    else:
        source = CapSource.SAFE_DEFAULT
        resolved = safe_default_watts
    target, clamp = bound_and_clamp(resolved, bounds, constraints)
    return CapDecision(
        requested_watts=requested,
        resolved_watts=resolved,
        target_milliwatts=target,
        source=source,
        safe_default_cause=cause,
        clamp=clamp,
    )


def _from_claims(
    claims: Sequence[ClaimCap],
    *,
    safe_default_watts: int,
    constraints: PowerConstraints,
    bounds: CapBounds,
) -> CapDecision:
    refs = tuple(sorted({cap.claim for cap in claims}))
    invalid = [cap for cap in claims if cap.watts is None]
    values = {cap.watts for cap in claims}
    requested: int | None = None
    cause: SafeDefaultCause | None = None
    problem: str | None = None
    if invalid:
        cause = SafeDefaultCause.INVALID
        problem = "; ".join(f"claim {cap.claim}: {cap.problem}" for cap in invalid)
    elif len(values) > 1:
        cause = SafeDefaultCause.DISAGREE
        problem = "claims disagree: " + ", ".join(f"{c.claim} {c.watts} W" for c in claims)
    else:
        requested = claims[0].watts
    resolved = requested if requested is not None else safe_default_watts
    target, clamp = bound_and_clamp(resolved, bounds, constraints)
    return CapDecision(
        requested_watts=requested,
        resolved_watts=resolved,
        target_milliwatts=target,
        source=CapSource.CLAIM if requested is not None else CapSource.SAFE_DEFAULT,
        safe_default_cause=cause,
        clamp=clamp,
        claims=refs,
        problem=problem,
    )


def bound_and_clamp(
    watts: int, bounds: CapBounds, constraints: PowerConstraints
) -> tuple[int, ClampDirection]:
    """The cluster's bounds, then the GPU's range: milliwatts to write, and the clamp
    that decided them (the GPU's when both moved the value)."""
    bounded, cluster = bounds.apply(watts)
    target, gpu = clamp_milliwatts(bounded * 1000, constraints)
    return target, gpu if gpu is not ClampDirection.NONE else cluster


def clamp_milliwatts(milliwatts: int, constraints: PowerConstraints) -> tuple[int, ClampDirection]:
    """Clamp to the settable range, saying which way (if any) it moved."""
    if milliwatts < constraints.min_milliwatts:
        return constraints.min_milliwatts, ClampDirection.RAISED_TO_MIN
    if milliwatts > constraints.max_milliwatts:
        return constraints.max_milliwatts, ClampDirection.LOWERED_TO_MAX
    return milliwatts, ClampDirection.NONE
