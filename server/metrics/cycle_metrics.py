"""Prometheus metrics: every CycleReport folded into counters, the rest read at scrape time.

A consumer of the hub like the gRPC streams: an asyncio task (supervised and
served over HTTP by server/http/exposition.py) follows the hub and folds each new
report into this module's own registry, so metrics cost the cycle thread
nothing. Whatever describes *now* (readiness, the age of the last good cycle,
stream subscribers) is computed when Prometheus scrapes.

Semantics a dashboard needs to know:

- Every series that can be known up front exists from the start at zero:
  each cycle result, failure reason, safe-default cause, clamp direction and
  multi-pod disposition, for every GPU in the start-up inventory (a GPU that
  appears later gets its series when first reported).
- ``capwatch_last_good_cycle_age_seconds`` is NaN until a cycle is enforced
  (the series is always there: its absence means the agent is not scraped).
  Alert on it together with ``capwatch_ready``.
- The per-GPU cap gauges are NaN while capwatch holds no cap on the GPU:
  before its first cycle, and after an idle, released or left step (its
  default or its own limit is in force). In observe mode the resolved gauge
  shows the cap capwatch would write and the applied one stays NaN. A failed
  step keeps the last value: a failed write changes nothing we know of.
- The cap gauges name the step's owner pod (``namespace``, ``pod``) when it
  has exactly one, else both are empty, and where the cap in force came from
  (``source``: annotation, agreed, claim, safe_default; empty while capwatch
  holds none) with the claims that asked it (``claim``: namespace/name, by
  commas). A GPU has one series per gauge at any time: new labels replace the
  old, so the old series is gone from the next scrape and the count stays at
  one per GPU however many pods and claims pass.
- A cycle counts as ``enforced`` exactly when the readiness rule says so;
  ``aborted`` when it stopped before reaching the GPUs; ``failed`` otherwise.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)

from capwatch.agent.gpus import GpuErrorClass
from capwatch.agent.ownership import UNSAVED_CYCLES_LIMIT
from capwatch.agent.podevents import EventCounts
from capwatch.agent.pods import PodRef
from capwatch.agent.reports import (
    CapSource,
    ClampDirection,
    CycleFailureKind,
    CycleReport,
    GpuResult,
    Outcome,
    Reason,
    SafeDefaultCause,
)
from capwatch.kit.version import package_version
from capwatch.server.certificates import Reloads
from capwatch.server.grpc.publication import Publication
from capwatch.server.http.exposition import ScrapeCollector
from capwatch.server.metrics.device_metrics import DeviceMetrics

log = logging.getLogger(__name__)

# Cycles take milliseconds on a few GPUs and may take minutes when NVML hangs.
CYCLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# The reasons a step fails with (observed and unclaimed are not failures).
FAILURE_REASONS = tuple(
    r
    for r in Reason
    if r not in (Reason.OK, Reason.IDLE, Reason.RELEASED, Reason.OBSERVED, Reason.UNCLAIMED)
)
CLAMP_DIRECTIONS = tuple(d for d in ClampDirection if d is not ClampDirection.NONE)


class CycleResult(str, Enum):
    ENFORCED = "enforced"
    FAILED = "failed"
    ABORTED = "aborted"


class Disposition(str, Enum):
    AGREED = "agreed"  # every owner pod asked for the same valid value
    DISAGREED = "disagreed"  # anything else: the safe default was used


def cycle_result(report: CycleReport) -> CycleResult:
    if report.enforced:
        return CycleResult.ENFORCED
    if report.abort_reason is not None:
        return CycleResult.ABORTED
    return CycleResult.FAILED


@dataclass(frozen=True, kw_only=True)
class GpuCaps:
    """What the cap gauges show for one GPU (None: NaN)."""

    uuid: str | None
    resolved_watts: int | None = None
    applied_watts: int | None = None
    # The step's one owner pod; None with no owner or several (empty labels).
    owner: PodRef | None = None
    # Where the cap came from, and the claims that asked it (namespace/name, by commas).
    source: CapSource | None = None
    claims: str = ""


def sole_owner(result: GpuResult) -> PodRef | None:
    return result.owners[0] if len(result.owners) == 1 else None


def next_caps(previous: GpuCaps | None, result: GpuResult) -> GpuCaps:
    """The gauges after one GPU step; see the module docstring for the rule."""
    uuid = result.uuid or (previous.uuid if previous else None)
    owner = sole_owner(result)
    if result.outcome is Outcome.ENFORCED:
        return GpuCaps(
            uuid=uuid,
            resolved_watts=result.resolved_watts,
            applied_watts=result.applied_watts,
            owner=owner,
            source=result.cap_source,
            claims=",".join(str(claim) for claim in result.claims),
        )
    if result.outcome is Outcome.OBSERVED:  # what it would write; nothing is in force
        return GpuCaps(
            uuid=uuid,
            resolved_watts=result.resolved_watts,
            owner=owner,
            source=result.cap_source,
            claims=",".join(str(claim) for claim in result.claims),
        )
    if result.outcome is not Outcome.FAILED:  # idle, released, left: no capwatch cap in force
        return GpuCaps(uuid=uuid)
    if previous is None or previous.uuid != uuid:  # another GPU at this index: nothing known
        return GpuCaps(uuid=uuid, resolved_watts=result.resolved_watts, owner=owner)
    if result.resolved_watts is None and not result.owners:  # failed before it knew anything
        return dataclasses.replace(previous, uuid=uuid)
    return GpuCaps(  # the cap in force is still the previous one, from its source
        uuid=uuid,
        resolved_watts=result.resolved_watts
        if result.resolved_watts is not None
        else previous.resolved_watts,
        applied_watts=previous.applied_watts,
        owner=owner,
        source=previous.source,
        claims=previous.claims,
    )


def _watts(value: int | None) -> float:
    return math.nan if value is None else float(value)


class Metrics:
    """The registry, and the fold of reports into it (on the event loop, never the cycle)."""

    def __init__(
        self,
        *,
        publication: Publication,
        version: str | None = None,
        certificate_reloads: Callable[[], Reloads | None] = lambda: None,
        pod_events: Callable[[], EventCounts | None] = lambda: None,
        malformed_requests: Callable[[], int] = lambda: 0,
        events_dropped: Callable[[], int] = lambda: 0,
    ) -> None:
        # _created series double the count of every counter for nothing a
        # dashboard uses; the switch is process-wide, and this process is ours.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.publication = publication
        self.registry = CollectorRegistry()
        self.folded_sequence = 0  # of the last report folded
        state = publication.hub.state()
        self._caps: Mapping[int, GpuCaps] = MappingProxyType(
            {index: GpuCaps(uuid=device.uuid) for index, device in state.devices.items()}
        )
        self._gpus: set[int] = set()
        r = self.registry
        self._cycles = Counter(
            "capwatch_cycles", "Reconcile cycles completed, by result.", ["result"], registry=r
        )
        self._duration = Histogram(
            "capwatch_cycle_duration_seconds",
            "Duration of each reconcile cycle.",
            buckets=CYCLE_BUCKETS,
            registry=r,
        )
        self._apply_failures = Counter(
            "capwatch_apply_failures",
            "Failed GPU steps, by GPU index and stable reason code.",
            ["gpu", "reason"],
            registry=r,
        )
        self._gpu_errors = Counter(
            "capwatch_gpu_errors",
            "Failed GPU steps that carry an NVML error class, by GPU index and class.",
            ["gpu", "error_class"],
            registry=r,
        )
        self._pod_view_failures = Counter(
            "capwatch_pod_view_failures",
            "Cycles that could not read a synced pod view (they enforce nothing).",
            registry=r,
        )
        self._save_failures = Counter(
            "capwatch_ownership_save_failures",
            "Attempts to save the ownership record that failed (state dir full, read-only...).",
            registry=r,
        )
        self._unsaved_cycles = Gauge(
            "capwatch_ownership_unsaved_cycles",
            "Cycles in a row that ended with the ownership record not saved; at "
            f"{UNSAVED_CYCLES_LIMIT} readiness fails with state-unwritable.",
            registry=r,
        )
        self._safe_default = Counter(
            "capwatch_safe_default",
            "GPU steps that resolved to the safe default cap, by cause.",
            ["cause"],
            registry=r,
        )
        self._clamped = Counter(
            "capwatch_clamped",
            "GPU steps whose cap was clamped into the GPU's settable range or the "
            "cluster's floor and ceiling, by direction.",
            ["direction"],
            registry=r,
        )
        self._multi_pod = Counter(
            "capwatch_multi_pod",
            "GPU steps with several owner pods, by whether their requests agreed.",
            ["disposition"],
            registry=r,
        )
        for result in CycleResult:
            self._cycles.labels(result=result.value)
        for cause in SafeDefaultCause:
            self._safe_default.labels(cause=cause.value)
        for direction in CLAMP_DIRECTIONS:
            self._clamped.labels(direction=direction.value)
        for disposition in Disposition:
            self._multi_pod.labels(disposition=disposition.value)
        self._precreate_gpus(state.devices)
        self._devices = DeviceMetrics(r, publication)
        r.register(
            _ScrapeCollector(
                publication=publication,
                caps=lambda: self._caps,
                certificate_reloads=certificate_reloads,
                pod_events=pod_events,
                malformed_requests=malformed_requests,
                events_dropped=events_dropped,
                info={
                    "version": version or package_version(),
                    "node": publication.node_name,
                    "instance_id": publication.hub.instance_id,
                },
            )
        )

    def _precreate_gpus(self, indexes: Iterable[int]) -> None:
        for index in indexes:
            if index in self._gpus:
                continue
            self._gpus.add(index)
            gpu = str(index)
            for reason in FAILURE_REASONS:
                self._apply_failures.labels(gpu=gpu, reason=reason.value)
            for error_class in GpuErrorClass:
                self._gpu_errors.labels(gpu=gpu, error_class=error_class.value)

    def fold(self, report: CycleReport) -> None:
        """Count one report. O(number of GPUs); a few microseconds each."""
        self._cycles.labels(result=cycle_result(report).value).inc()
        self._duration.observe(report.duration_s)
        if any(f.kind is CycleFailureKind.POD_VIEW_NOT_SYNCED for f in report.failures):
            self._pod_view_failures.inc()
        self._save_failures.inc(report.save_failures)
        self._unsaved_cycles.set(report.unsaved_cycles)
        self._devices.fold(report)
        self._precreate_gpus(g.index for g in report.gpus)
        caps = dict(self._caps)
        for result in report.gpus:
            self._fold_gpu(result)
            caps[result.index] = next_caps(caps.get(result.index), result)
        self._caps = MappingProxyType(caps)  # one reference swap: scrapes see all or none
        self.folded_sequence = report.sequence

    def _fold_gpu(self, result: GpuResult) -> None:
        gpu = str(result.index)
        if result.failed:
            self._apply_failures.labels(gpu=gpu, reason=result.reason.value).inc()
            if result.error_class is not None:
                self._gpu_errors.labels(gpu=gpu, error_class=result.error_class.value).inc()
        if result.cap_source is CapSource.SAFE_DEFAULT and result.safe_default_cause is not None:
            self._safe_default.labels(cause=result.safe_default_cause.value).inc()
        if result.clamp is not ClampDirection.NONE:
            self._clamped.labels(direction=result.clamp.value).inc()
        if len(result.owners) > 1 and result.cap_source is not None:
            agreed = result.cap_source is CapSource.AGREED
            disposition = Disposition.AGREED if agreed else Disposition.DISAGREED
            self._multi_pod.labels(disposition=disposition.value).inc()

    async def follow(self) -> None:
        """Fold every report the hub publishes until its readers are released."""
        hub = self.publication.hub
        while True:
            if not await hub.wait(self.folded_sequence):
                if hub.readers_released:
                    return
                continue
            reports = hub.since(self.folded_sequence)
            if reports is None:  # fell behind the ring: go on from the latest
                latest = hub.state().latest
                reports = () if latest is None else (latest,)
                log.warning(
                    "metrics fell behind the hub; cycles uncounted after=%d before=%d",
                    self.folded_sequence,
                    latest.sequence if latest else 0,
                )
            for report in reports:
                self.fold(report)


class _ScrapeCollector(ScrapeCollector):
    """Series computed at scrape time (on the event loop, like the fold)."""

    def __init__(
        self,
        *,
        publication: Publication,
        caps: Callable[[], Mapping[int, GpuCaps]],
        certificate_reloads: Callable[[], Reloads | None],
        pod_events: Callable[[], EventCounts | None],
        malformed_requests: Callable[[], int],
        events_dropped: Callable[[], int],
        info: dict[str, str],
    ) -> None:
        self._pub = publication
        self._caps = caps
        self._certificate_reloads = certificate_reloads
        self._pod_events = pod_events
        self._malformed_requests = malformed_requests
        self._events_dropped = events_dropped
        self._info = info

    def families(self, *, populated: bool) -> list[Metric]:
        info = InfoMetricFamily("capwatch", "The agent serving these metrics.")
        age = GaugeMetricFamily(
            "capwatch_last_good_cycle_age_seconds",
            "Seconds since the last enforced cycle finished (NaN before the first).",
        )
        ready = GaugeMetricFamily("capwatch_ready", "1 when the agent is ready, else 0.")
        subscribers = GaugeMetricFamily(
            "capwatch_stream_subscribers", "Open Watch and DRA health streams."
        )
        messages = CounterMetricFamily(
            "capwatch_stream_messages", "Messages sent on the health streams."
        )
        refusals = CounterMetricFamily(
            "capwatch_stream_refusals",
            "Streams refused a slot (RESOURCE_EXHAUSTED): every slot open to the client "
            "taken (subscriber_limit), or its address holding its most (peer_limit).",
            labels=["reason"],
        )
        malformed = CounterMetricFamily(
            "capwatch_grpc_malformed_requests",
            "gRPC requests refused with INVALID_ARGUMENT because their bytes did not parse.",
        )
        dropped = CounterMetricFamily(
            "capwatch_gpu_events_dropped",
            "Device events (XID, ECC) the agent could not keep: more distinct GPU, kind "
            "and code keys between two cycles than it holds. Each drop is also a warning.",
        )
        labels = ["gpu", "uuid", "namespace", "pod", "source", "claim"]
        resolved = GaugeMetricFamily(
            "capwatch_gpu_resolved_cap_watts",
            "Cap the policy resolved for the GPU (NaN while capwatch holds none).",
            labels=labels,
        )
        applied = GaugeMetricFamily(
            "capwatch_gpu_applied_cap_watts",
            "Cap last written to the GPU (NaN while capwatch holds none).",
            labels=labels,
        )
        families: list[Metric] = [
            info,
            age,
            ready,
            subscribers,
            messages,
            refusals,
            malformed,
            dropped,
            resolved,
            applied,
        ]
        # Only when on: renewals on a plaintext port, or Events never posted, would
        # mean nothing.
        families += _optional_counter(
            "capwatch_grpc_tls_reloads",
            "TLS certificate files on the gRPC port taken up (loaded) or refused "
            "(rejected: the previous pair stays in service; each bad state once).",
            self._certificate_reloads(),
            populated=populated,
        )
        families += _optional_counter(
            "capwatch_pod_events",
            "Kubernetes Events on capped pods: posted, failed (the API refused or was "
            "unreachable) and dropped (the queue was full).",
            self._pod_events(),
            populated=populated,
        )
        if not populated:
            return families
        hub = self._pub.hub
        state = hub.state()
        readiness = hub.readiness(state)
        info.add_metric([], self._info)
        age.add_metric(
            [], math.nan if readiness.last_good_age_s is None else readiness.last_good_age_s
        )
        ready.add_metric([], 1.0 if readiness.ready else 0.0)
        subscribers.add_metric([], float(self._pub.subscribers))
        messages.add_metric([], float(self._pub.messages_sent))
        for reason, count in self._pub.admission.refusals.items():
            refusals.add_metric([reason.value], float(count))
        malformed.add_metric([], float(self._malformed_requests()))
        dropped.add_metric([], float(self._events_dropped()))
        for index, caps in sorted(self._caps().items()):
            owner = caps.owner
            values = [
                str(index),
                caps.uuid or "",
                owner.namespace if owner else "",
                owner.name if owner else "",
                caps.source.value if caps.source else "",
                caps.claims,
            ]
            resolved.add_metric(values, _watts(caps.resolved_watts))
            applied.add_metric(values, _watts(caps.applied_watts))
        return families


def _optional_counter(
    name: str, documentation: str, counts: Reloads | EventCounts | None, *, populated: bool
) -> list[Metric]:
    """A counter family labelled ``result`` by the fields of ``counts``; none if None."""
    if counts is None:
        return []
    family = CounterMetricFamily(name, documentation, labels=["result"])
    if populated:
        for result, count in dataclasses.asdict(counts).items():
            family.add_metric([result], float(count))
    return [family]
