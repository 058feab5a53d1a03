"""Device-health metrics: the GPUs' own faults and telemetry (:mod:`capwatch.agent.health`).

XID events are counted as reports are folded (the counter must not miss the
events of a cycle nobody scraped); everything else describes *now* and is read
from the hub's device table at scrape time, like the cap gauges:

- ``capwatch_gpu_healthy``: 1 healthy, 0 unhealthy (an active fault or a failed
  step), NaN while unknown (no cycle yet, or the agent's reports are stale);
- ``capwatch_gpu_faults{kind}``: active faults of each kind, every kind present at 0;
- power draw, enforced limit and the volatile uncorrected ECC count: NaN when
  the device does not support the read (or it failed);
- ``capwatch_gpu_throttle_reason_active{reason}``: 1 or 0 per reason, absent
  when the reasons could not be read.

XID codes are bounded per GPU (:data:`XID_CODES_PER_GPU`); further distinct
numbers count under ``code="other"``, so a device spewing random XIDs cannot
grow the series without bound.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from capwatch.agent.devices import DeviceHealth, device_health
from capwatch.agent.health.faults import FaultKind
from capwatch.agent.health.telemetry import DeviceEventKind, ThrottleReason
from capwatch.agent.reports import CycleReport
from capwatch.server.grpc.publication import Publication

XID_CODES_PER_GPU = 32
_OTHER = "other"


class DeviceMetrics:
    """The device-health series, registered into ``registry``."""

    def __init__(self, registry: CollectorRegistry, publication: Publication) -> None:
        self._xids = Counter(
            "capwatch_gpu_xid_events",
            "XID error events the GPU reported, ignored ones included, by XID number.",
            ["gpu", "uuid", "code"],
            registry=registry,
        )
        self._codes: dict[str, set[str]] = {}  # per GPU label: the XID codes with a series
        registry.register(_DeviceCollector(publication))

    def fold(self, report: CycleReport) -> None:
        for event in report.events:
            if event.kind is not DeviceEventKind.XID:
                continue
            gpu = str(event.index)
            codes = self._codes.setdefault(gpu, set())
            code = str(event.code)
            if code not in codes:
                if len(codes) >= XID_CODES_PER_GPU:
                    code = _OTHER
                codes.add(code)
            self._xids.labels(gpu=gpu, uuid=event.uuid or "", code=code).inc(event.count)


class _DeviceCollector(Collector):
    def __init__(self, publication: Publication) -> None:
        self._pub = publication

    def describe(self) -> Iterable[Metric]:
        return _families()

    def collect(self) -> Iterable[Metric]:
        families = _families()
        healthy, faults, draw, limit, ecc, throttle = families
        hub = self._pub.hub
        state = hub.state()
        readiness = hub.readiness(state)
        for index, device in sorted(state.devices.items()):
            labels = [str(index), device.uuid or ""]
            health = device_health(device, latest=state.latest, readiness=readiness)
            healthy.add_metric(labels, _HEALTH_VALUE[health])
            result = device.result
            active = result.faults if result is not None else ()
            for kind in FaultKind:
                count = sum(1 for f in active if f.kind is kind)
                faults.add_metric([*labels, kind.value], float(count))
            readings = result.readings if result is not None else None
            if readings is None:
                for family in (draw, limit, ecc):
                    family.add_metric(labels, math.nan)
                continue
            draw.add_metric(labels, _watts(readings.power_draw_milliwatts))
            limit.add_metric(labels, _watts(readings.enforced_limit_milliwatts))
            ecc.add_metric(labels, _number(readings.ecc_uncorrected_volatile))
            if readings.throttle_reasons is not None:
                active_reasons = set(readings.throttle_reasons)
                for reason in ThrottleReason:
                    throttle.add_metric(
                        [*labels, reason.value], 1.0 if reason in active_reasons else 0.0
                    )
        return families


_HEALTH_VALUE = {
    DeviceHealth.HEALTHY: 1.0,
    DeviceHealth.UNHEALTHY: 0.0,
    DeviceHealth.UNKNOWN: math.nan,
}


def _families() -> list[GaugeMetricFamily]:
    labels = ["gpu", "uuid"]
    return [
        GaugeMetricFamily(
            "capwatch_gpu_healthy",
            "1 when the GPU is healthy, 0 when it has an active fault or its step failed, "
            "NaN while unknown.",
            labels=labels,
        ),
        GaugeMetricFamily(
            "capwatch_gpu_faults",
            "Active device faults on the GPU, by kind (xid, gpu_lost, ecc_uncorrected, "
            "row_remap_failure).",
            labels=[*labels, "kind"],
        ),
        GaugeMetricFamily(
            "capwatch_gpu_power_draw_watts",
            "Power the GPU drew at its last cycle (NaN when not available).",
            labels=labels,
        ),
        GaugeMetricFamily(
            "capwatch_gpu_enforced_limit_watts",
            "Power limit the GPU enforces, read back after the cycle's write (NaN when not "
            "available).",
            labels=labels,
        ),
        GaugeMetricFamily(
            "capwatch_gpu_ecc_uncorrected_errors",
            "The GPU's volatile uncorrected ECC error count (NaN when not available).",
            labels=labels,
        ),
        GaugeMetricFamily(
            "capwatch_gpu_throttle_reason_active",
            "1 while the clock-event (throttle) reason is active on the GPU, else 0; absent "
            "when the reasons could not be read.",
            labels=[*labels, "reason"],
        ),
    ]


def _watts(milliwatts: int | None) -> float:
    return math.nan if milliwatts is None else milliwatts / 1000


def _number(value: int | None) -> float:
    return math.nan if value is None else float(value)
