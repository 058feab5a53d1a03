"""The fold: reports published into a hub become counters and gauges, series exist at zero."""

from __future__ import annotations

import asyncio
import math
import re
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from capwatch.agent.devices import inventory
from capwatch.agent.gpus import GpuErrorClass
from capwatch.agent.hub import Hub
from capwatch.agent.podevents import EventCounts
from capwatch.agent.pods import PodRef
from capwatch.agent.reports import (
    AbortReason,
    CapSource,
    ClampDirection,
    CycleFailure,
    CycleFailureKind,
    CycleReport,
    GpuResult,
    Outcome,
    Reason,
    SafeDefaultCause,
)
from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.api.gen.capwatch.v1 import node_health_pb2_grpc as pb_grpc
from capwatch.kit.clock import FakeClock
from capwatch.server.certificates import Reloads
from capwatch.server.grpc.publication import Publication
from capwatch.server.metrics.cycle_metrics import FAILURE_REASONS, Metrics
from capwatch.server.metrics.endpoint import TASK_NAME, MetricsServer
from capwatch.server.metrics.scrape_series import GpuCaps, next_caps
from capwatch.server.settings import DeviceNamerTemplate
from tests.metrics.conftest import Followed
from tests.metrics.support import eventually, scrape, series_of, value
from tests.server.harness import NODE, POD, UUIDS, failed, idle, ok, released, start_harness

pytestmark = pytest.mark.asyncio

OTHER_POD = PodRef(namespace="ml", name="evaluator", uid="aaaaaaaa-0000-4000-8000-000000000002")


def decided(
    index: int,
    *,
    source: CapSource,
    cause: SafeDefaultCause | None = None,
    clamp: ClampDirection = ClampDirection.NONE,
    owners: tuple[PodRef, ...] = (POD,),
) -> GpuResult:
    """An enforced step with a chosen policy decision."""
    return GpuResult(
        index=index,
        uuid=UUIDS[index],
        outcome=Outcome.ENFORCED,
        reason=Reason.OK,
        message="capped",
        owners=owners,
        resolved_watts=300,
        applied_watts=300,
        cap_source=source,
        safe_default_cause=cause,
        clamp=clamp,
        process_count=len(owners),
    )


async def test_every_known_series_exists_at_zero_before_any_cycle(followed: Followed):
    """Results, reasons per inventory GPU, error classes, causes, directions: all at 0."""
    found = await followed.settle()
    cycles = series_of(found, "capwatch_cycles_total")
    assert cycles == {frozenset({("result", r)}): 0.0 for r in ("enforced", "failed", "aborted")}
    failures = series_of(found, "capwatch_apply_failures_total")
    assert set(failures) == {
        frozenset({("gpu", str(g)), ("reason", r.value)})
        for g in range(len(UUIDS))
        for r in FAILURE_REASONS
    }
    assert set(failures.values()) == {0.0}
    assert {r.value for r in FAILURE_REASONS} >= {"write_failed", "release_deferred"}
    assert not {"ok", "idle", "released"} & {r.value for r in FAILURE_REASONS}
    errors = series_of(found, "capwatch_gpu_errors_total")
    assert len(errors) == len(UUIDS) * len(GpuErrorClass)
    assert set(errors.values()) == {0.0}
    assert series_of(found, "capwatch_safe_default_total") == {
        frozenset({("cause", c.value)}): 0.0 for c in SafeDefaultCause
    }
    assert series_of(found, "capwatch_clamped_total") == {
        frozenset({("direction", d)}): 0.0
        for d in ("raised_to_min", "lowered_to_max", "raised_to_floor", "lowered_to_ceiling")
    }
    assert series_of(found, "capwatch_multi_pod_total") == {
        frozenset({("disposition", d)}): 0.0 for d in ("agreed", "disagreed")
    }
    assert value(found, "capwatch_pod_view_failures_total") == 0.0
    assert value(found, "capwatch_cycle_duration_seconds_count") == 0.0
    assert value(found, "capwatch_stream_messages_total") == 0.0
    assert value(found, "capwatch_stream_subscribers") == 0.0
    assert value(found, "capwatch_ready") == 0.0
    assert math.isnan(value(found, "capwatch_last_good_cycle_age_seconds"))
    for name in ("capwatch_gpu_resolved_cap_watts", "capwatch_gpu_applied_cap_watts"):
        gauges = series_of(found, name)
        assert set(gauges) == {
            frozenset(
                {("gpu", str(i)), ("uuid", u), ("namespace", ""), ("pod", "")}
                | {("source", ""), ("claim", "")}
            )
            for i, u in enumerate(UUIDS)
        }
        assert all(math.isnan(v) for v in gauges.values())
    assert not any(name.endswith("_created") for name, _ in found)
    info = value(
        found,
        "capwatch_info",
        version="9.9.9-test",
        node=NODE,
        instance_id=followed.harness.hub.instance_id,
    )
    assert info == 1.0


async def test_cycles_are_counted_by_result_with_their_duration(followed: Followed):
    """Enforced, failed and aborted cycles each count once; every cycle is observed."""
    h = followed.harness
    h.publish()
    h.publish([ok(0), failed(1, GpuErrorClass.INSUFFICIENT_POWER), idle(2)])
    h.publish(abort=AbortReason.POD_VIEW_NOT_SYNCED)
    h.publish()
    found = await followed.settle()
    assert value(found, "capwatch_cycles_total", result="enforced") == 2.0
    assert value(found, "capwatch_cycles_total", result="failed") == 1.0
    assert value(found, "capwatch_cycles_total", result="aborted") == 1.0
    assert value(found, "capwatch_pod_view_failures_total") == 1.0
    assert value(found, "capwatch_cycle_duration_seconds_count") == 4.0
    # The harness's cycles last 1 ms: each lands in the 5 ms bucket.
    assert value(found, "capwatch_cycle_duration_seconds_bucket", le="0.005") == 4.0
    assert value(found, "capwatch_apply_failures_total", gpu="1", reason="write_failed") == 1.0
    assert value(found, "capwatch_gpu_errors_total", gpu="1", error_class="insufficient_power") == 1
    others = series_of(found, "capwatch_apply_failures_total")
    assert sum(others.values()) == 1.0
    assert followed.metrics.folded_sequence == 4


async def test_a_cycle_level_failure_without_gpu_failures_counts_as_failed(followed: Followed):
    """A device-count failure fails the cycle (not aborted) and is no pod-view failure."""
    followed.harness.publish(
        failures=[CycleFailure(kind=CycleFailureKind.DEVICE_COUNT_FAILED, message="x")]
    )
    found = await followed.settle()
    assert value(found, "capwatch_cycles_total", result="failed") == 1.0
    assert value(found, "capwatch_cycles_total", result="aborted") == 0.0
    assert value(found, "capwatch_pod_view_failures_total") == 0.0


async def test_policy_decisions_are_counted_per_gpu_step(followed: Followed):
    """Safe-default causes, clamp directions and multi-pod dispositions, each per GPU."""
    two = (POD, OTHER_POD)
    h = followed.harness
    h.publish(
        [
            decided(0, source=CapSource.SAFE_DEFAULT, cause=SafeDefaultCause.MISSING),
            decided(1, source=CapSource.AGREED, owners=two, clamp=ClampDirection.LOWERED_TO_MAX),
            decided(2, source=CapSource.SAFE_DEFAULT, cause=SafeDefaultCause.DISAGREE, owners=two),
        ]
    )
    h.publish(
        [
            decided(0, source=CapSource.ANNOTATION, clamp=ClampDirection.RAISED_TO_MIN),
            decided(1, source=CapSource.AGREED, owners=two),
            decided(2, source=CapSource.SAFE_DEFAULT, cause=SafeDefaultCause.NO_POD, owners=()),
        ]
    )
    found = await followed.settle()
    assert series_of(found, "capwatch_safe_default_total") == {
        frozenset({("cause", "missing")}): 1.0,
        frozenset({("cause", "invalid")}): 0.0,
        frozenset({("cause", "disagree")}): 1.0,
        frozenset({("cause", "no_pod")}): 1.0,
    }
    assert value(found, "capwatch_clamped_total", direction="lowered_to_max") == 1.0
    assert value(found, "capwatch_clamped_total", direction="raised_to_min") == 1.0
    assert value(found, "capwatch_multi_pod_total", disposition="agreed") == 2.0
    assert value(found, "capwatch_multi_pod_total", disposition="disagreed") == 1.0


async def test_cap_gauges_hold_the_cap_capwatch_has_in_force(followed: Followed):
    """Enforced sets both; a failed write keeps the last applied; idle and released clear."""
    h = followed.harness

    async def caps(index: int) -> tuple[float, float]:
        found = await followed.settle()
        gauges = series_of(found, "capwatch_gpu_resolved_cap_watts")
        (labels,) = [dict(k) for k in gauges if ("gpu", str(index)) in k]
        return (
            value(found, "capwatch_gpu_resolved_cap_watts", **labels),
            value(found, "capwatch_gpu_applied_cap_watts", **labels),
        )

    h.publish([ok(0, 400), ok(1, 250), idle(2)])
    assert await caps(0) == (400.0, 400.0)
    assert await caps(1) == (250.0, 250.0)
    h.publish([failed(0), released(1), idle(2)])  # failed(0) resolved 350, wrote nothing
    assert await caps(0) == (350.0, 400.0)
    resolved, applied = await caps(1)
    assert math.isnan(resolved)
    assert math.isnan(applied)
    h.publish([idle(0), released(1), idle(2)])
    assert all(math.isnan(v) for v in await caps(0))
    h.publish(abort=AbortReason.POD_VIEW_NOT_SYNCED)  # reaches no GPU: nothing changes
    assert all(math.isnan(v) for v in await caps(0))


async def test_next_caps_forgets_a_cap_when_another_gpu_appears_at_the_index():
    """A failed step on a different UUID does not inherit the old GPU's applied cap."""
    before = GpuCaps(uuid="GPU-old", resolved_watts=400, applied_watts=400)
    step = GpuResult(
        index=0,
        uuid="GPU-new",
        outcome=Outcome.FAILED,
        reason=Reason.IDENTITY_MISMATCH,
        message="x",
    )
    assert next_caps(before, step) == GpuCaps(uuid="GPU-new")
    unknown = GpuResult(
        index=0, uuid=None, outcome=Outcome.FAILED, reason=Reason.UUID_READ_FAILED, message="x"
    )
    assert next_caps(before, unknown) == before  # same GPU as far as anyone knows


async def test_a_gpu_first_seen_later_gets_its_series_at_zero(followed: Followed):
    """A GPU index missing from the start-up inventory gets every failure series once seen."""
    newcomer = GpuResult(
        index=7, uuid="GPU-77", outcome=Outcome.IDLE, reason=Reason.IDLE, message="idle"
    )
    followed.harness.publish([ok(0), ok(1), ok(2), newcomer])
    found = await followed.settle()
    assert value(found, "capwatch_apply_failures_total", gpu="7", reason="write_failed") == 0.0
    assert value(found, "capwatch_gpu_errors_total", gpu="7", error_class="timeout") == 0.0
    applied = value(
        found,
        "capwatch_gpu_applied_cap_watts",
        gpu="7",
        uuid="GPU-77",
        namespace="",
        pod="",
        source="",
        claim="",
    )
    assert math.isnan(applied)


async def test_a_reader_behind_the_ring_resyncs_from_the_latest():
    """Reports lost to the ring are skipped, not replayed; folding goes on from the latest."""
    harness = await start_harness(capacity=2)
    try:
        metrics = Metrics(publication=harness.publication)
        for _ in range(5):  # before the follower first runs: 1-3 leave the ring
            harness.publish()
        task = asyncio.create_task(metrics.follow())
        await eventually(lambda: metrics.folded_sequence >= 5)
        assert value(scrape(metrics.registry), "capwatch_cycles_total", result="enforced") == 1
        harness.publish()
        await eventually(lambda: metrics.folded_sequence >= 6)
        assert value(scrape(metrics.registry), "capwatch_cycles_total", result="enforced") == 2
    finally:
        await harness.server.stop()
    await asyncio.wait_for(task, 2)  # released readers end the follower


async def test_readiness_and_last_good_age_are_computed_at_scrape_time():
    """Age grows with the monotonic clock between scrapes; ready lapses when stale."""
    clock = FakeClock()
    hub = Hub(clock=clock, stale_after_s=3.0, devices=inventory({0: UUIDS[0]}, wall=clock.wall()))
    publication = Publication(
        hub=hub,
        clock=clock,
        node_name=NODE,
        interval_s=1.0,
        namer=DeviceNamerTemplate("gpu-{index}"),
        pool_name=NODE,
        max_subscribers=10,
    )
    metrics = Metrics(publication=publication)

    def publish(sequence: int, *gpus: GpuResult) -> None:
        now = clock.monotonic()
        hub.publish(
            CycleReport(
                sequence=sequence,
                started_wall=clock.wall(),
                finished_wall=clock.wall(),
                started_monotonic=now - 0.5,
                finished_monotonic=now,
                gpus=gpus,
            )
        )

    publish(1, ok(0))
    clock.advance(1.25)
    found = scrape(metrics.registry)  # nothing folded: scrape-time series only need the hub
    assert value(found, "capwatch_last_good_cycle_age_seconds") == 1.25
    assert value(found, "capwatch_ready") == 1.0
    publish(2, failed(0))
    clock.advance(1.0)
    found = scrape(metrics.registry)
    assert value(found, "capwatch_last_good_cycle_age_seconds") == 2.25
    assert value(found, "capwatch_ready") == 0.0  # the last cycle failed
    publish(3, ok(0))
    clock.advance(3.0)
    found = scrape(metrics.registry)
    assert value(found, "capwatch_last_good_cycle_age_seconds") == 3.0
    assert value(found, "capwatch_ready") == 0.0  # stale


async def test_stream_subscribers_and_messages_are_read_at_scrape_time(followed: Followed):
    """An open Watch stream is one subscriber; each message it got is counted."""
    h = followed.harness
    async with h.channel() as channel:
        stream = pb_grpc.NodeHealthServiceStub(channel).Watch(pb.WatchRequest())
        assert (await stream.read()).WhichOneof("event") == "snapshot"
        h.publish()
        while (await stream.read()).WhichOneof("event") != "cycle":
            pass
        found = await followed.settle()
        assert value(found, "capwatch_stream_subscribers") == 1.0
        assert value(found, "capwatch_stream_messages_total") >= 2.0
        assert value(found, "capwatch_stream_messages_total") == h.publication.messages_sent
        stream.cancel()
    await eventually(lambda: h.publication.subscribers == 0)
    assert value(scrape(followed.metrics.registry), "capwatch_stream_subscribers") == 0.0


class ExplodingMetrics(Metrics):
    """A registry whose fold fails, as a bug in it would."""

    def fold(self, report: CycleReport) -> None:
        raise RuntimeError("fold failed")


async def test_a_follower_that_dies_stops_the_agent_but_a_release_does_not():
    """The supervised task calls on_fatal when folding raises, not when readers are
    released: the released follower has ended on its own, and been judged, before its
    server is stopped (a stop would have cancelled it and proved nothing)."""
    harness = await start_harness()
    fatal: list[str] = []
    quiet: list[str] = []
    try:
        dying = MetricsServer(
            metrics=ExplodingMetrics(publication=harness.publication),
            address="127.0.0.1",
            port=0,
            on_fatal=lambda: fatal.append("stop"),
        )
        await dying.start()
        harness.publish()
        await eventually(lambda: bool(fatal))
        await dying.stop()

        calm = MetricsServer(
            metrics=Metrics(publication=harness.publication),
            address="127.0.0.1",
            port=0,
            on_fatal=lambda: quiet.append("stop"),
        )
        await calm.start()
        harness.publication.stopping.set()  # the server's stop order: stopping, then release
        harness.hub.release_readers()
        # The follower ends by itself (not cancelled by a stop) and its end is judged
        # before calm.stop() is even called.
        await eventually(lambda: not any(t.get_name() == TASK_NAME for t in asyncio.all_tasks()))
        await asyncio.sleep(0)  # its done-callback (the supervision) has run
        assert quiet == []
        await calm.stop()
    finally:
        await harness.server.stop()
    assert fatal == ["stop"]
    assert quiet == []


async def test_tls_reloads_and_pod_events_are_exposed_only_when_on():
    """capwatch_grpc_tls_reloads_total{result} and capwatch_pod_events_total{result} read
    their counts at scrape time; an agent without TLS or Events has no such series."""
    harness = await start_harness()
    try:
        counts = Reloads(loaded=2, rejected=1)
        events = EventCounts(posted=5, failed=2, dropped=1)
        with_both = Metrics(
            publication=harness.publication,
            certificate_reloads=lambda: counts,
            pod_events=lambda: events,
        )
        found = scrape(with_both.registry)
        assert value(found, "capwatch_grpc_tls_reloads_total", result="loaded") == 2
        assert value(found, "capwatch_grpc_tls_reloads_total", result="rejected") == 1
        assert value(found, "capwatch_pod_events_total", result="posted") == 5
        assert value(found, "capwatch_pod_events_total", result="failed") == 2
        assert value(found, "capwatch_pod_events_total", result="dropped") == 1
        plain = scrape(Metrics(publication=harness.publication).registry)
        assert not series_of(plain, "capwatch_grpc_tls_reloads_total")
        assert not series_of(plain, "capwatch_pod_events_total")
    finally:
        await harness.server.stop()


def _metrics_doc() -> str:
    return (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()


async def test_docs_metrics_lists_every_family_with_its_type():
    """docs/metrics.md has a row for each family the agent exposes (TLS on), with its type,
    and no row for one it does not; the failure reasons listed are the pre-created ones."""
    harness = await start_harness()
    try:
        metrics = Metrics(
            publication=harness.publication,
            certificate_reloads=lambda: Reloads(loaded=0, rejected=0),
            pod_events=lambda: EventCounts(posted=0, failed=0, dropped=0),
        )
        exposed = {
            family.name: family.type
            for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        }
    finally:
        await harness.server.stop()
    doc = _metrics_doc()
    rows = {
        name: kind
        for name, kind in re.findall(r"^\| `(capwatch_\w+)` \| (\w+)", doc, flags=re.MULTILINE)
        if not name.startswith("capwatch_controller_")  # the controller's own section
    }
    # The parser names counters without _total; the docs use the exposed sample name.
    documented = {name.removesuffix("_total"): kind for name, kind in rows.items()}
    assert documented == exposed
    reasons_row = next(line for line in doc.splitlines() if "capwatch_apply_failures_total" in line)
    listed = set(re.findall(r"`([a-z_]+)`", reasons_row.split("|")[4]))
    assert listed == {reason.value for reason in FAILURE_REASONS}
