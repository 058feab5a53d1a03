"""Prometheus metrics: every CycleReport folded into counters, the rest read at scrape time.

A consumer of the hub like the gRPC streams: an asyncio task (supervised and
served over HTTP by server/http/exposition.py) follows the hub and folds each new
report into this module's own registry, so metrics cost the cycle thread
nothing. Whatever describes *now* (readiness, the age of the last good cycle,
stream subscribers) is computed when Prometheus scrapes
(:mod:`capwatch.server.metrics.scrape_series`).

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

import logging
from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from types import MappingProxyType

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)

from capwatch.agent.gpus import GpuErrorClass
from capwatch.agent.ownership import UNSAVED_CYCLES_LIMIT
from capwatch.agent.podevents import EventCounts
from capwatch.agent.reports import (
    CapSource,
    ClampDirection,
    CycleFailureKind,
    CycleReport,
    GpuResult,
    Reason,
    SafeDefaultCause,
)
from capwatch.kit.version import package_version
from capwatch.server.certificates import Reloads
from capwatch.server.grpc.publication import Publication
from capwatch.server.metrics.device_metrics import DeviceMetrics
from capwatch.server.metrics.scrape_series import GpuCaps, ScrapeSeries, next_caps

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
            ScrapeSeries(
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
