"""capwatch.v1.NodeHealthService/Watch over a real channel: order, fields, resume, limits."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from capwatch.agent.pods import PodRef
from capwatch.agent.reports import CapSource, ClampDirection, GpuResult, Outcome, Reason
from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.api.gen.capwatch.v1 import node_health_pb2_grpc as pb_grpc
from capwatch.api.gen.v1 import dra_health_pb2 as dra_pb
from capwatch.api.gen.v1 import dra_health_pb2_grpc as dra_grpc
from capwatch.server.grpc.mapping import timestamp
from tests.server.harness import (
    NODE,
    POD,
    UUIDS,
    ServerHarness,
    eventually,
    failed,
    idle,
    next_event,
    ok,
    running,
    settings_for,
)

pytestmark = pytest.mark.asyncio

QUIET = Duration(seconds=60)  # no heartbeat within a test: every message is asserted


def watch(channel: grpc.aio.Channel, **request: Any) -> Any:
    return pb_grpc.NodeHealthServiceStub(channel).Watch(pb.WatchRequest(**request))


async def read_events(stream: Any, count: int) -> list[tuple[str, Any]]:
    """The next ``count`` messages as (kind, payload), whatever their kind."""
    events = []
    async with asyncio.timeout(2):
        for _ in range(count):
            message = await stream.read()
            assert message is not grpc.aio.EOF
            kind = message.WhichOneof("event")
            events.append((kind, getattr(message, kind)))
    return events


async def test_snapshot_first_then_one_message_per_cycle_in_order(harness: ServerHarness) -> None:
    """The snapshot describes the agent (sequence 0, no last cycle); then cycles 1..3 in order."""
    async with harness.channel() as channel:
        stream = watch(channel, heartbeat_interval=QUIET)
        [(kind, snapshot)] = await read_events(stream, 1)
        assert kind == "snapshot"
        assert snapshot.node_name == NODE
        assert snapshot.agent_instance_id == harness.hub.instance_id
        assert snapshot.interval.ToMilliseconds() == 500
        assert snapshot.stale_after.ToMilliseconds() == 1500
        assert snapshot.sequence == 0
        assert not snapshot.resync
        assert not snapshot.HasField("last_cycle")
        assert [d.index for d in snapshot.devices] == [0, 1, 2]
        for _ in range(3):
            harness.publish()
        events = await read_events(stream, 3)
        assert [kind for kind, _ in events] == ["cycle"] * 3
        assert [cycle.sequence for _, cycle in events] == [1, 2, 3]
        assert all(cycle.enforced for _, cycle in events)
        stream.cancel()


async def test_cycle_maps_every_device_field(harness: ServerHarness) -> None:
    """Health, outcome, reason, error class, owners, watts, cap source and clamp reach the wire."""
    second = PodRef(namespace="ml", name="trainer-2", uid="aaaaaaaa-0000-4000-8000-000000000002")
    agreed = GpuResult(
        index=0,
        uuid=UUIDS[0],
        outcome=Outcome.ENFORCED,
        reason=Reason.OK,
        message="capped at 100 W (raised to the minimum)",
        owners=(POD, second),
        requested_watts=80,
        resolved_watts=80,
        applied_watts=100,
        cap_source=CapSource.AGREED,
        clamp=ClampDirection.RAISED_TO_MIN,
        process_count=2,
    )
    async with harness.channel() as channel:
        stream = watch(channel, heartbeat_interval=QUIET)
        await next_event(stream, "snapshot")
        report = harness.publish([agreed, failed(1), idle(2)])
        cycle = await next_event(stream, "cycle")
        stream.cancel()

    assert cycle.sequence == 1
    assert not cycle.enforced
    assert cycle.abort_reason == pb.ABORT_REASON_NONE
    assert cycle.failure_summary == "gpu1:write_failed"
    assert cycle.readiness.reason == pb.READINESS_REASON_CYCLE_FAILED
    assert cycle.finished == timestamp(report.finished_wall)
    capped, broken, quiet = cycle.devices

    assert (capped.index, capped.uuid, capped.dra_device_name) == (0, UUIDS[0], "gpu-0")
    assert capped.health == pb.DEVICE_HEALTH_HEALTHY
    assert capped.outcome == pb.OUTCOME_ENFORCED
    assert (capped.reason, capped.error_class) == ("ok", "")
    assert capped.message == "capped at 100 W (raised to the minimum)"
    assert [(p.namespace, p.name, p.uid) for p in capped.owners] == [
        ("ml", "trainer", POD.uid),
        ("ml", "trainer-2", second.uid),
    ]
    assert (capped.requested_watts, capped.resolved_watts, capped.applied_watts) == (80, 80, 100)
    assert capped.cap_source == pb.CAP_SOURCE_AGREED
    assert capped.clamp_direction == pb.CLAMP_DIRECTION_RAISED_TO_MIN
    assert capped.process_count == 2
    assert capped.sequence == 1
    assert capped.last_update_time == timestamp(report.finished_wall)
    assert capped.last_transition_time == timestamp(report.finished_wall)

    assert (broken.index, broken.dra_device_name) == (1, "gpu-1")
    assert broken.health == pb.DEVICE_HEALTH_UNHEALTHY
    assert broken.outcome == pb.OUTCOME_FAILED
    assert (broken.reason, broken.error_class) == ("write_failed", "no_permission")
    assert broken.HasField("requested_watts")
    assert not broken.HasField("applied_watts")  # nothing was written
    assert broken.clamp_direction == pb.CLAMP_DIRECTION_NONE

    assert quiet.health == pb.DEVICE_HEALTH_HEALTHY
    assert quiet.outcome == pb.OUTCOME_IDLE
    assert quiet.reason == "idle"
    assert list(quiet.owners) == []
    assert quiet.cap_source == pb.CAP_SOURCE_UNSPECIFIED
    assert not quiet.HasField("requested_watts")


# Per cycle: what each GPU reports; a change of outcome or reason is a transition.
TRANSITIONS = (
    (ok(0), ok(1), ok(2)),
    (ok(0), ok(1), ok(2)),
    (failed(0), ok(1), ok(2)),  # gpu0 changes outcome
    (failed(0), ok(1), ok(2)),
    (ok(0), ok(1), ok(2)),  # gpu0 changes back
    (ok(0), idle(1), ok(2)),  # gpu1 changes outcome and reason
)
# For each cycle, the cycle (1-based) of each GPU's last transition.
EXPECTED_TRANSITION = ((1, 1, 1), (1, 1, 1), (3, 1, 1), (3, 1, 1), (5, 1, 1), (5, 6, 1))


@pytest.mark.parametrize("delivery", ["one-by-one", "batched"])
async def test_transition_time_moves_only_when_outcome_or_reason_changes(
    harness: ServerHarness, delivery: str
) -> None:
    """last_transition_time moves only on a change; last_update_time moves every cycle.

    Batched: the subscriber reads the cycles after all of them were published,
    when the hub's device table has moved on; each cycle must still carry the
    transition times as of that cycle.
    """
    async with harness.channel() as channel:
        stream = watch(channel, heartbeat_interval=QUIET)
        await next_event(stream, "snapshot")
        reports, cycles = [], []
        for gpus in TRANSITIONS:
            reports.append(harness.publish(gpus))
            if delivery == "one-by-one":
                cycles.append(await next_event(stream, "cycle"))
        if delivery == "batched":
            cycles = [cycle for _, cycle in await read_events(stream, len(TRANSITIONS))]
        stream.cancel()

    finished = [timestamp(r.finished_wall) for r in reports]
    assert len({(t.seconds, t.nanos) for t in finished}) == len(finished)  # distinguishable
    for cycle, expected in zip(cycles, EXPECTED_TRANSITION, strict=True):
        assert [d.last_update_time for d in cycle.devices] == [finished[cycle.sequence - 1]] * 3
        assert [d.last_transition_time for d in cycle.devices] == [
            finished[n - 1] for n in expected
        ], f"cycle {cycle.sequence}"


async def test_resumed_cycles_keep_transition_times_from_before_the_gap(
    harness: ServerHarness,
) -> None:
    """Replayed cycles date an unchanged GPU's transition before the gap, a change at itself."""
    reports = [harness.publish([ok(0), ok(1), ok(2)]) for _ in range(3)]
    reports.append(harness.publish([ok(0), failed(1), ok(2)]))
    async with harness.channel() as channel:
        stream = watch(
            channel,
            since_sequence=1,
            agent_instance_id=harness.hub.instance_id,
            heartbeat_interval=QUIET,
        )
        events = await read_events(stream, 3)
        stream.cancel()
    assert [(kind, cycle.sequence) for kind, cycle in events] == [
        ("cycle", 2),
        ("cycle", 3),
        ("cycle", 4),
    ]
    first, change = timestamp(reports[0].finished_wall), timestamp(reports[3].finished_wall)
    for _, cycle in events:
        assert cycle.devices[0].last_transition_time == first
        assert cycle.devices[2].last_transition_time == first
    assert events[-1][1].devices[1].last_transition_time == change


async def test_heartbeats_arrive_between_cycles_and_carry_readiness() -> None:
    """With heartbeat_interval at its 1 s floor a quiet stream gets heartbeats, spaced, with
    live readiness (the agent's interval is 5 s, so neither its cycles nor staleness interfere)."""
    async with running(interval_s=5.0) as harness, harness.channel() as channel:
        stream = watch(channel, heartbeat_interval=Duration(seconds=1))
        await next_event(stream, "snapshot")
        before = await next_event(stream, "heartbeat")
        assert before.last_sequence == 0
        assert before.agent_instance_id == harness.hub.instance_id
        assert before.readiness.reason == pb.READINESS_REASON_NO_CYCLE_YET
        assert abs(before.time.ToNanoseconds() / 1e9 - time.time()) < 5
        harness.publish()
        assert (await next_event(stream, "cycle")).sequence == 1
        first = await next_event(stream, "heartbeat")
        second = await next_event(stream, "heartbeat")
        stream.cancel()
    for beat in (first, second):
        assert beat.last_sequence == 1
        assert beat.readiness.ready
        assert beat.readiness.reason == pb.READINESS_REASON_READY
        assert beat.readiness.HasField("last_cycle_age")
    gap = (second.time.ToNanoseconds() - first.time.ToNanoseconds()) / 1e9
    assert 0.95 <= gap < 10  # the requested period, not a busy loop


@pytest.mark.parametrize("requested", [None, Duration()], ids=["absent", "explicit-zero"])
async def test_no_heartbeat_interval_means_the_agent_default(requested: Duration | None) -> None:
    """Absent or zero heartbeat_interval (proto: 0 = the default) beats at 1.5 x the agent's
    interval: a quiet 0.15 s apart, not at once, not at the cycle interval, and not held to
    the 1 s floor of a requested interval."""
    async with running(interval_s=0.1) as harness, harness.channel() as channel:
        request = {} if requested is None else {"heartbeat_interval": requested}
        stream = watch(channel, **request)
        await next_event(stream, "snapshot")
        # The timeouts are hang guards: each beat is due 0.15 s after the last message.
        beats = [await next_event(stream, "heartbeat", timeout=5.0) for _ in range(6)]
        stream.cancel()
    assert all(beat.last_sequence == 0 for beat in beats)
    # The agent stamps each beat as it sends it, so the gaps are the agent's own, and a
    # client slow to read cannot shorten one: not sooner than the quiet period.
    sent = [beat.time.ToNanoseconds() / 1e9 for beat in beats]
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    assert all(gap >= 0.14 for gap in gaps), gaps
    # Five gaps at the 1 s floor would take 5 s; at 0.15 s they take 0.75 s. The bound
    # sits between, seconds clear of both, so a loaded machine cannot reach it.
    assert sent[-1] - sent[0] < 3.0, gaps


@pytest.mark.parametrize("instance", ["same", "unset"])
async def test_resume_within_the_ring_gets_exactly_the_missed_cycles(
    harness: ServerHarness, instance: str
) -> None:
    """since_sequence inside the ring: the missed cycles, no snapshot, then live cycles."""
    for _ in range(5):
        harness.publish()
    instance_id = harness.hub.instance_id if instance == "same" else ""
    async with harness.channel() as channel:
        stream = watch(
            channel, since_sequence=2, agent_instance_id=instance_id, heartbeat_interval=QUIET
        )
        missed = await read_events(stream, 3)
        harness.publish()
        [live] = await read_events(stream, 1)
        stream.cancel()
    assert [(kind, cycle.sequence) for kind, cycle in missed] == [
        ("cycle", 3),
        ("cycle", 4),
        ("cycle", 5),
    ]
    assert (live[0], live[1].sequence) == ("cycle", 6)


async def test_resume_at_the_current_sequence_gets_a_heartbeat_not_a_snapshot(
    harness: ServerHarness,
) -> None:
    """Nothing missed: a heartbeat at the current sequence confirms the resume, then live cycles."""
    for _ in range(3):
        harness.publish()
    async with harness.channel() as channel:
        stream = watch(
            channel,
            since_sequence=3,
            agent_instance_id=harness.hub.instance_id,
            heartbeat_interval=QUIET,
        )
        [(kind, beat)] = await read_events(stream, 1)
        assert (kind, beat.last_sequence) == ("heartbeat", 3)
        harness.publish()
        [(kind, cycle)] = await read_events(stream, 1)
        assert (kind, cycle.sequence) == ("cycle", 4)
        stream.cancel()


@pytest.mark.parametrize(
    ("since", "instance"),
    [
        (5, "same"),  # 40 published, ring of 16: cycle 6 is gone
        (3, "other"),  # sequences of another agent instance mean nothing here
        (99, "same"),  # beyond the current sequence: the client is confused
        (41, "same"),  # one beyond
    ],
    ids=["gap", "other-instance", "beyond", "one-beyond"],
)
async def test_resume_that_cannot_be_served_from_the_ring_resyncs(
    harness: ServerHarness, since: int, instance: str
) -> None:
    """A gap, another agent instance or a future sequence: a snapshot marked resync, then live."""
    for _ in range(40):
        harness.publish()
    instance_id = harness.hub.instance_id if instance == "same" else "another-agent-instance"
    async with harness.channel() as channel:
        stream = watch(
            channel, since_sequence=since, agent_instance_id=instance_id, heartbeat_interval=QUIET
        )
        [(kind, snapshot)] = await read_events(stream, 1)
        assert kind == "snapshot"
        assert snapshot.resync
        assert snapshot.sequence == 40
        assert snapshot.last_cycle.sequence == 40
        assert snapshot.agent_instance_id == harness.hub.instance_id
        assert len(snapshot.devices) == 3
        harness.publish()
        [(kind, cycle)] = await read_events(stream, 1)
        assert (kind, cycle.sequence) == ("cycle", 41)
        stream.cancel()


@pytest.mark.parametrize(
    ("device_filter", "expected"),
    [
        (pb.DeviceFilter(indexes=[0, 2]), [0, 2]),
        (pb.DeviceFilter(uuids=[UUIDS[1].lower()]), [1]),  # UUIDs match whatever their case
        (pb.DeviceFilter(indexes=[0], uuids=[UUIDS[2]]), [0, 2]),
        (pb.DeviceFilter(indexes=[7]), []),  # no such GPU: an empty list, not an error
    ],
    ids=["indexes", "uuid", "either", "none"],
)
async def test_device_filter_applies_to_snapshot_and_cycles(
    harness: ServerHarness, device_filter: pb.DeviceFilter, expected: list[int]
) -> None:
    """Only the GPUs the filter names, in the snapshot, its last cycle and every cycle."""
    harness.publish()
    async with harness.channel() as channel:
        stream = watch(channel, filter=device_filter, heartbeat_interval=QUIET)
        snapshot = await next_event(stream, "snapshot")
        harness.publish([failed(0), ok(1), idle(2)])
        cycle = await next_event(stream, "cycle")
        stream.cancel()
        unary = await pb_grpc.NodeHealthServiceStub(channel).GetSnapshot(
            pb.GetSnapshotRequest(filter=device_filter)
        )
    assert [d.index for d in snapshot.devices] == expected
    assert [d.index for d in snapshot.last_cycle.devices] == expected
    assert [d.index for d in cycle.devices] == expected
    assert [d.index for d in unary.snapshot.devices] == expected
    assert [d.index for d in unary.snapshot.last_cycle.devices] == expected
    assert not cycle.enforced  # the filter narrows the list, never the verdict


@pytest.mark.parametrize(
    "request_fields",
    [
        {"heartbeat_interval": Duration(nanos=10_000_000)},
        {"heartbeat_interval": Duration(nanos=999_000_000)},
        {"heartbeat_interval": Duration(seconds=3601)},
        {"heartbeat_interval": Duration(seconds=2**62)},  # past what a timedelta holds
        {"heartbeat_interval": Duration(seconds=-1)},
        {"filter": pb.DeviceFilter(uuids=[f"GPU-{i}" for i in range(257)])},
        {"filter": pb.DeviceFilter(uuids=["GPU-" + "0" * 125])},  # 129 characters
    ],
    ids=[
        "heartbeat-too-small",
        "heartbeat-under-a-second",
        "heartbeat-too-large",
        "heartbeat-huge",
        "heartbeat-negative",
        "uuids",
        "uuid-len",
    ],
)
async def test_invalid_watch_requests_are_rejected(
    harness: ServerHarness, request_fields: dict[str, Any]
) -> None:
    """Out-of-range heartbeats (under the 1 s floor, over an hour, too big for a timedelta)
    and oversized filters: INVALID_ARGUMENT, and no slot is held."""
    async with harness.channel() as channel:
        stream = watch(channel, **request_fields)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stream.read()
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        if "filter" in request_fields:
            with pytest.raises(grpc.aio.AioRpcError) as unary:
                await pb_grpc.NodeHealthServiceStub(channel).GetSnapshot(
                    pb.GetSnapshotRequest(filter=request_fields["filter"])
                )
            assert unary.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert harness.publication.subscribers == 0


async def test_requests_at_the_limits_are_accepted(harness: ServerHarness) -> None:
    """The bounds themselves are valid: 1 s and 3600 s heartbeats, 256 UUIDs of 128 chars."""
    uuids = [f"GPU-{i:0124d}" for i in range(256)]
    assert {len(u) for u in uuids} == {128}
    async with harness.channel() as channel:
        for request in (
            pb.WatchRequest(heartbeat_interval=Duration(seconds=1)),
            pb.WatchRequest(heartbeat_interval=Duration(seconds=3600)),
            pb.WatchRequest(filter=pb.DeviceFilter(uuids=uuids)),
        ):
            stream = pb_grpc.NodeHealthServiceStub(channel).Watch(request)
            await next_event(stream, "snapshot")
            stream.cancel()


async def test_subscriber_limit_counts_every_stream_and_frees_slots() -> None:
    """With a limit of 2, a third stream (Watch or DRA) gets RESOURCE_EXHAUSTED until one ends."""
    settings = settings_for(
        extra={"grpc_max_subscribers": "2", "grpc_reserved_local_subscribers": "0"}
    )
    async with running(settings=settings) as harness, harness.channel() as channel:
        first = watch(channel, heartbeat_interval=QUIET)
        await next_event(first, "snapshot")
        dra = dra_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            dra_pb.NodeWatchResourcesRequest()
        )
        assert len((await dra.read()).devices) == 3
        assert harness.publication.subscribers == 2

        for refused in (
            watch(channel),
            dra_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                dra_pb.NodeWatchResourcesRequest()
            ),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await refused.read()
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

        first.cancel()

        async def freed() -> bool:
            return harness.publication.subscribers == 1

        await eventually(freed)
        again = watch(channel, heartbeat_interval=QUIET)
        assert (await next_event(again, "snapshot")).node_name == NODE
        again.cancel()
        dra.cancel()


async def test_stop_ends_open_streams_with_ok_and_refuses_new_ones() -> None:
    """server.stop() ends Watch and DRA streams cleanly at once (OK, without waiting out
    the 30 s grace)."""
    settings = settings_for(extra={"grpc_grace": "30"})
    async with running(settings=settings) as harness, harness.channel() as channel:
        stream = watch(channel, heartbeat_interval=QUIET)
        await next_event(stream, "snapshot")
        dra = dra_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            dra_pb.NodeWatchResourcesRequest()
        )
        await dra.read()

        started = time.monotonic()
        stopping = asyncio.create_task(harness.server.stop())
        # Hang guards, far inside the 30 s grace that streams left open would be cut at.
        async with asyncio.timeout(10):
            assert await stream.read() is grpc.aio.EOF
            assert await dra.read() is grpc.aio.EOF
        assert await stream.code() == grpc.StatusCode.OK
        assert await dra.code() == grpc.StatusCode.OK
        await stopping
        assert time.monotonic() - started < 10  # ended by the server, not at the grace

        late = watch(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await late.read()
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert harness.publication.subscribers == 0
