"""What one reconcile cycle did: the frozen values the loop publishes.

A :class:`CycleReport` is the single source of truth every consumer reads
(readiness, metrics, the gRPC stream, the CLI). ``enforced`` is derived from
the report's contents rather than stored, so it can never disagree with them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import Enum

from capwatch.agent.dra.claims import ClaimRef
from capwatch.agent.dra.slices import DeviceName
from capwatch.agent.gpus import GpuErrorClass
from capwatch.agent.health.faults import Fault
from capwatch.agent.health.telemetry import DeviceEvent, Readings
from capwatch.agent.pods import PodRef
from capwatch.kit.readiness import STATE_UNWRITABLE_TOKEN


class Outcome(str, Enum):
    """Per-GPU result of one cycle."""

    ENFORCED = "enforced"  # a cap was written and the backend said OK
    IDLE = "idle"  # no compute processes: nothing written, nothing claimed
    RELEASED = "released"  # the owner left; the default limit was restored
    FAILED = "failed"  # a required action did not complete
    # Observe mode (--mode observe): what the cycle would have written, nothing written.
    OBSERVED = "observed"
    # Nobody asks for a cap (--unclaimed-policy leave): the GPU's limit left as it is.
    LEFT = "left"


class Reason(str, Enum):
    """Stable reason codes. Never change a value: consumers match on them."""

    OK = "ok"
    IDLE = "idle"
    RELEASED = "released"
    UUID_READ_FAILED = "uuid_read_failed"
    IDENTITY_MISMATCH = "identity_mismatch"
    IDENTITY_UNCONFIRMED = "identity_unconfirmed"
    PROCESS_LIST_FAILED = "process_list_failed"
    CONSTRAINTS_READ_FAILED = "constraints_read_failed"
    WRITE_FAILED = "write_failed"
    RELEASE_FAILED = "release_failed"
    RELEASE_DEFERRED = "release_deferred"
    INTERNAL_ERROR = "internal_error"
    # Neither written nor released: a claim of its pods cannot be read or resolved.
    CLAIM_HELD = "claim_held"
    # Observe mode: the cap (or the release) the cycle would have written.
    OBSERVED = "observed"
    # No claim, no annotation on any of its pods: left as it is (--unclaimed-policy leave).
    UNCLAIMED = "unclaimed"


class CapSource(str, Enum):
    ANNOTATION = "annotation"  # one pod, valid annotation
    AGREED = "agreed"  # several pods, all valid and equal
    CLAIM = "claim"  # the device's ResourceClaim(s), valid and equal
    SAFE_DEFAULT = "safe_default"  # anything else


class SafeDefaultCause(str, Enum):
    """Why the safe default was used (metrics and messages)."""

    MISSING = "missing"  # a pod had no annotation
    INVALID = "invalid"  # a pod's annotation (a claim's PowerCap) is not a valid wattage
    DISAGREE = "disagree"  # several pods asked for different values
    NO_POD = "no_pod"  # the processes belong to no known pod


class ClampDirection(str, Enum):
    NONE = "none"
    RAISED_TO_MIN = "raised_to_min"  # the GPU's settable minimum
    LOWERED_TO_MAX = "lowered_to_max"  # the GPU's settable maximum
    RAISED_TO_FLOOR = "raised_to_floor"  # the cluster's floor (--cap-floor-watts)
    LOWERED_TO_CEILING = "lowered_to_ceiling"  # the cluster's ceiling (--cap-ceiling-watts)


class AbortReason(str, Enum):
    """Why a cycle stopped before (or instead of) reconciling GPUs."""

    POD_VIEW_NOT_SYNCED = "pod_view_not_synced"
    INTERNAL_ERROR = "internal_error"


class CycleFailureKind(str, Enum):
    """Cycle-level failures that are not tied to one GPU's step."""

    DEVICE_COUNT_FAILED = "device_count_failed"
    POD_VIEW_NOT_SYNCED = "pod_view_not_synced"
    INTERNAL_ERROR = "internal_error"
    # The ownership record could not be saved for several cycles in a row.
    STATE_UNWRITABLE = STATE_UNWRITABLE_TOKEN
    # A claim asks a cap of a device no slice of this node resolves to a GPU now.
    CLAIM_DEVICE_UNMAPPED = "claim_device_unmapped"
    # A claim a pod of this node uses cannot be read (not found, not allocated, failed).
    CLAIM_UNAVAILABLE = "claim_unavailable"
    # The node's slices name another GPU for a device its workload was prepared on.
    CLAIM_DEVICE_MOVED = "claim_device_moved"


@dataclass(frozen=True, kw_only=True)
class CycleFailure:
    kind: CycleFailureKind
    message: str


@dataclass(frozen=True, kw_only=True)
class GpuResult:
    """One GPU's step in one cycle."""

    index: int
    uuid: str | None
    outcome: Outcome
    reason: Reason
    message: str
    owners: tuple[PodRef, ...] = ()
    # The ResourceClaims whose capwatch.io config decided the cap (may be empty).
    claims: tuple[ClaimRef, ...] = ()
    # Why the claims' cap was not taken (an invalid PowerCap, claims disagreeing), naming them.
    claim_problem: str | None = None
    # The GPU as its DRA driver's ResourceSlice names it (None: no slice read names it).
    dra_device: DeviceName | None = None
    error_class: GpuErrorClass | None = None
    requested_watts: int | None = None
    resolved_watts: int | None = None
    applied_watts: int | None = None
    # Observe mode: the limit the step would have written (a release: the default).
    intended_watts: int | None = None
    cap_source: CapSource | None = None
    safe_default_cause: SafeDefaultCause | None = None
    clamp: ClampDirection = ClampDirection.NONE
    process_count: int = 0
    # The device's own state after the step: its active faults, and what it read.
    faults: tuple[Fault, ...] = ()
    readings: Readings | None = None  # None: the step could not identify the GPU

    def __hash__(self) -> int:
        # Results key the server's per-GPU encoding cache, once per GPU per
        # cycle. The generated hash covers every field, four of them enums whose
        # __hash__ is Python code; these fields tell results apart as well, and
        # equal results still hash alike (equality compares every field). The
        # power draw moves every cycle on real GPUs: without it, a cache of
        # results would chain thousands of unequal ones under one hash.
        draw = self.readings.power_draw_milliwatts if self.readings is not None else None
        return hash(
            (self.index, self.uuid, self.message, self.applied_watts, draw, len(self.faults))
        )

    @property
    def failed(self) -> bool:
        return self.outcome is Outcome.FAILED

    @property
    def healthy(self) -> bool:
        """Its step succeeded and the device has no active fault (see agent.health.faults)."""
        return self.outcome is not Outcome.FAILED and not self.faults


@dataclass(frozen=True, kw_only=True)
class CycleReport:
    """The outcome of one ``reconcile_once()``."""

    sequence: int
    started_wall: float
    finished_wall: float
    started_monotonic: float
    finished_monotonic: float
    gpus: tuple[GpuResult, ...] = ()
    failures: tuple[CycleFailure, ...] = ()
    abort_reason: AbortReason | None = None
    # True when a shutdown short-circuited the cycle: the fold so far is the result.
    interrupted: bool = False
    # Cycles in a row, this one included, that ended with the ownership record
    # not saved (0: saved, or nothing to save); and failed saves in this cycle.
    unsaved_cycles: int = 0
    save_failures: int = 0
    # XID and ECC events drained this cycle, ignored XIDs included (metrics count them).
    events: tuple[DeviceEvent, ...] = ()
    # Observe mode: nothing was written; the GPUs say what would have been.
    observe: bool = False

    @property
    def duration_s(self) -> float:
        return max(0.0, self.finished_monotonic - self.started_monotonic)

    # Derived once per report: the hub, readiness, metrics, logs and every
    # stream's encoding all ask. (The report is immutable, so the value is too.)
    @functools.cached_property
    def enforced(self) -> bool:
        """Every required action completed and every input was obtained."""
        return (
            self.abort_reason is None and not self.failures and not any(g.failed for g in self.gpus)
        )

    @functools.cached_property
    def failure_summary(self) -> str:
        """A short, stable description of why the cycle was not enforced ('' if it was)."""
        if self.abort_reason is not None:
            return self.abort_reason.value
        parts = [f.kind.value for f in self.failures]
        parts += [f"gpu{g.index}:{g.reason.value}" for g in self.gpus if g.failed]
        return ",".join(parts)
