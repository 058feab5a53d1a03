"""Device-health metrics (server/metrics/device_metrics.py): faults, XIDs, power, ECC."""

from __future__ import annotations

import dataclasses
import math

import pytest

from capwatch.agent.health.faults import Fault, FaultKind
from capwatch.agent.health.telemetry import DeviceEvent, DeviceEventKind, Readings, ThrottleReason
from capwatch.server.metrics.cycle_metrics import Metrics
from capwatch.server.metrics.device_metrics import XID_CODES_PER_GPU
from tests.metrics.conftest import Followed
from tests.metrics.support import scrape, series_of, value
from tests.server.harness import UUIDS, failed, idle, ok, start_harness

pytestmark = pytest.mark.asyncio

XID_79 = Fault(kind=FaultKind.XID, code=79, first_seen_wall=1.0, last_seen_wall=2.0, count=2)
READ = Readings(
    power_draw_milliwatts=251_500,
    enforced_limit_milliwatts=250_000,
    throttle_reasons=(ThrottleReason.SW_POWER_CAP,),
    ecc_uncorrected_volatile=7,
)


def xid(index: int, code: int, count: int = 1) -> DeviceEvent:
    return DeviceEvent(
        kind=DeviceEventKind.XID,
        index=index,
        uuid=UUIDS[index],
        code=code,
        count=count,
        first_wall=1.0,
        last_wall=1.0,
    )


def gpu(index: int) -> dict[str, str]:
    return {"gpu": str(index), "uuid": UUIDS[index]}


async def test_health_faults_and_telemetry_follow_the_latest_results(followed: Followed):
    """A faulted GPU reads 0 healthy with its fault kind at 1 and the others at 0; its
    power, enforced limit, ECC count and throttle reasons are what it read; a GPU whose
    reads are not available shows NaN and no throttle series; a failed step is unhealthy."""
    faulted = dataclasses.replace(ok(0), faults=(XID_79,), readings=READ)
    blind = dataclasses.replace(idle(1), readings=Readings(failed_reads=("power_draw",)))
    followed.harness.publish([faulted, blind, failed(2)])
    found = await followed.settle()
    assert value(found, "capwatch_gpu_healthy", **gpu(0)) == 0.0
    assert value(found, "capwatch_gpu_healthy", **gpu(1)) == 1.0
    assert value(found, "capwatch_gpu_healthy", **gpu(2)) == 0.0
    faults = {
        dict(labels)["kind"]: v
        for labels, v in series_of(found, "capwatch_gpu_faults").items()
        if dict(labels)["gpu"] == "0"
    }
    assert faults == {"xid": 1.0, "gpu_lost": 0.0, "ecc_uncorrected": 0.0, "row_remap_failure": 0.0}
    assert value(found, "capwatch_gpu_power_draw_watts", **gpu(0)) == 251.5
    assert value(found, "capwatch_gpu_enforced_limit_watts", **gpu(0)) == 250.0
    assert value(found, "capwatch_gpu_ecc_uncorrected_errors", **gpu(0)) == 7.0
    throttle = {
        dict(labels)["reason"]: v
        for labels, v in series_of(found, "capwatch_gpu_throttle_reason_active").items()
        if dict(labels)["gpu"] == "0"
    }
    assert throttle == {r.value: float(r is ThrottleReason.SW_POWER_CAP) for r in ThrottleReason}
    assert math.isnan(value(found, "capwatch_gpu_power_draw_watts", **gpu(1)))
    assert not any(
        dict(labels)["gpu"] == "1"
        for labels in series_of(found, "capwatch_gpu_throttle_reason_active")
    )
    followed.harness.publish([ok(0), blind, ok(2)])  # the fault cleared
    found = await followed.settle()
    assert value(found, "capwatch_gpu_healthy", **gpu(0)) == 1.0
    assert value(found, "capwatch_gpu_faults", **gpu(0), kind="xid") == 0.0


async def test_health_is_nan_before_any_cycle(followed: Followed):
    """Before a cycle reaches a GPU its health is unknown: NaN, not 1 or 0."""
    found = await followed.settle()
    assert math.isnan(value(found, "capwatch_gpu_healthy", **gpu(0)))


async def test_xid_events_are_counted_by_gpu_and_code_ignored_ones_included(followed: Followed):
    """Every XID event drained in a cycle is counted, whether or not the policy calls it a
    fault; counts accumulate across cycles."""
    followed.harness.publish(events=[xid(0, 79, 3), xid(0, 13), xid(1, 48)])
    followed.harness.publish(events=[xid(0, 79, 2)])
    found = await followed.settle()
    assert value(found, "capwatch_gpu_xid_events_total", **gpu(0), code="79") == 5.0
    assert value(found, "capwatch_gpu_xid_events_total", **gpu(0), code="13") == 1.0
    assert value(found, "capwatch_gpu_xid_events_total", **gpu(1), code="48") == 1.0


async def test_distinct_xid_codes_are_bounded_per_gpu(followed: Followed):
    """Past XID_CODES_PER_GPU distinct numbers on one GPU, new ones count as code="other"."""
    codes = range(1000, 1000 + XID_CODES_PER_GPU + 50)
    followed.harness.publish(events=[xid(0, code) for code in codes])
    found = await followed.settle()
    series = series_of(found, "capwatch_gpu_xid_events_total")
    assert len(series) == XID_CODES_PER_GPU + 1
    assert value(found, "capwatch_gpu_xid_events_total", **gpu(0), code="other") == 50.0


@pytest.mark.asyncio
async def test_dropped_device_events_are_exported_from_the_backends_total():
    """capwatch_gpu_events_dropped_total reads the GPU backend's running count of events
    it could not keep (0 until one is dropped), at scrape time."""
    harness = await start_harness()
    dropped = [0]
    try:
        metrics = Metrics(publication=harness.publication, events_dropped=lambda: dropped[0])
        assert value(scrape(metrics.registry), "capwatch_gpu_events_dropped_total") == 0.0
        dropped[0] = 12
        assert value(scrape(metrics.registry), "capwatch_gpu_events_dropped_total") == 12.0
    finally:
        await harness.server.stop()
