"""Readiness and device health in GetSnapshot and in Watch messages, cycle by cycle."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from capwatch.agent.reports import AbortReason
from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.api.gen.capwatch.v1 import node_health_pb2_grpc as pb_grpc
from capwatch.kit.clock import FakeClock
from tests.server.harness import (
    UUIDS,
    ServerHarness,
    failed,
    next_event,
    ok,
    running,
    settings_for,
)

pytestmark = pytest.mark.asyncio


async def snapshot_of(harness: ServerHarness) -> pb.NodeSnapshot:
    async with harness.channel() as channel:
        response = await pb_grpc.NodeHealthServiceStub(channel).GetSnapshot(pb.GetSnapshotRequest())
    return response.snapshot


def healths(snapshot: pb.NodeSnapshot) -> list[int]:
    return [d.health for d in snapshot.devices]


async def test_before_any_cycle_nothing_is_known(harness: ServerHarness) -> None:
    """NO_CYCLE_YET, no ages, no last cycle; every GPU listed UNKNOWN with reason not_reported."""
    snapshot = await snapshot_of(harness)
    assert not snapshot.readiness.ready
    assert snapshot.readiness.reason == pb.READINESS_REASON_NO_CYCLE_YET
    assert not snapshot.readiness.HasField("last_good_cycle_age")
    assert not snapshot.readiness.HasField("last_cycle_age")
    assert not snapshot.HasField("last_cycle")
    assert snapshot.sequence == 0
    assert [(d.index, d.uuid, d.dra_device_name) for d in snapshot.devices] == [
        (i, UUIDS[i], f"gpu-{i}") for i in range(3)
    ]
    for device in snapshot.devices:
        assert device.health == pb.DEVICE_HEALTH_UNKNOWN
        assert device.outcome == pb.OUTCOME_UNSPECIFIED
        assert device.reason == "not_reported"
        assert device.sequence == 0


async def test_after_an_enforced_cycle_the_node_is_ready(harness: ServerHarness) -> None:
    """READY with fresh ages; every GPU HEALTHY; the last cycle is the one published."""
    harness.publish()
    snapshot = await snapshot_of(harness)
    assert snapshot.readiness.ready
    assert snapshot.readiness.reason == pb.READINESS_REASON_READY
    assert snapshot.readiness.last_good_cycle_age.ToMilliseconds() < 1000
    assert snapshot.readiness.last_cycle_age.ToMilliseconds() < 1000
    assert snapshot.sequence == 1
    assert snapshot.last_cycle.sequence == 1
    assert snapshot.last_cycle.enforced
    assert snapshot.last_cycle.readiness.ready
    assert healths(snapshot) == [pb.DEVICE_HEALTH_HEALTHY] * 3
    assert [d.outcome for d in snapshot.devices] == [pb.OUTCOME_ENFORCED] * 3


async def test_after_a_failed_cycle_the_failed_gpu_is_unhealthy(harness: ServerHarness) -> None:
    """CYCLE_FAILED naming the GPU, which is UNHEALTHY, the others HEALTHY; last good age kept."""
    harness.publish()
    harness.publish([ok(0), failed(1), ok(2)])
    snapshot = await snapshot_of(harness)
    assert not snapshot.readiness.ready
    assert snapshot.readiness.reason == pb.READINESS_REASON_CYCLE_FAILED
    assert snapshot.readiness.detail == "gpu1:write_failed"
    assert snapshot.readiness.HasField("last_good_cycle_age")  # cycle 1 was enforced
    assert healths(snapshot) == [
        pb.DEVICE_HEALTH_HEALTHY,
        pb.DEVICE_HEALTH_UNHEALTHY,
        pb.DEVICE_HEALTH_HEALTHY,
    ]
    assert snapshot.devices[1].error_class == "no_permission"
    assert not snapshot.last_cycle.enforced


async def test_after_an_aborted_cycle_every_gpu_is_unknown(harness: ServerHarness) -> None:
    """A cycle aborted on the pod view reaches no GPU: all UNKNOWN, keeping their last results."""
    harness.publish()
    harness.publish(abort=AbortReason.POD_VIEW_NOT_SYNCED)
    snapshot = await snapshot_of(harness)
    assert snapshot.readiness.reason == pb.READINESS_REASON_CYCLE_FAILED
    assert snapshot.readiness.detail == "pod_view_not_synced"
    assert snapshot.last_cycle.abort_reason == pb.ABORT_REASON_POD_VIEW_NOT_SYNCED
    assert [f.kind for f in snapshot.last_cycle.failures] == ["pod_view_not_synced"]
    assert list(snapshot.last_cycle.devices) == []
    assert healths(snapshot) == [pb.DEVICE_HEALTH_UNKNOWN] * 3
    # What is known about each GPU is still its last result, from cycle 1.
    assert [(d.outcome, d.sequence) for d in snapshot.devices] == [(pb.OUTCOME_ENFORCED, 1)] * 3


async def test_a_quiet_agent_turns_stale_everywhere() -> None:
    """Interval 0.125 s, on a fake clock: a cycle 0.25 s old is still READY in GetSnapshot,
    and at exactly 0.375 s (3 x interval) with no newer cycle it is STALE there and in
    heartbeats, with that age; GPUs UNKNOWN. The clock is stepped, never slept on."""
    clock = FakeClock()
    async with running(interval_s=0.125, clock=clock) as harness, harness.channel() as channel:
        stub = pb_grpc.NodeHealthServiceStub(channel)
        # The agent's default heartbeat (1.5 x interval), below what a client may ask for.
        stream = stub.Watch(pb.WatchRequest())
        await next_event(stream, "snapshot")
        harness.publish()
        cycle = await next_event(stream, "cycle")
        assert cycle.readiness.reason == pb.READINESS_REASON_READY
        clock.advance(0.25)
        fresh = (await stub.GetSnapshot(pb.GetSnapshotRequest())).snapshot
        assert fresh.readiness.ready
        assert fresh.readiness.reason == pb.READINESS_REASON_READY
        assert fresh.readiness.last_cycle_age.ToMilliseconds() == 250

        clock.advance(0.125)
        snapshot = (await stub.GetSnapshot(pb.GetSnapshotRequest())).snapshot
        assert not snapshot.readiness.ready
        assert snapshot.readiness.reason == pb.READINESS_REASON_STALE
        assert snapshot.readiness.last_cycle_age.ToMilliseconds() == 375
        assert healths(snapshot) == [pb.DEVICE_HEALTH_UNKNOWN] * 3
        # Heartbeats say so too, without a cycle to carry it (a hang guard: one is due
        # every 0.1875 s of real time).
        async with asyncio.timeout(5):
            while True:
                beat = await next_event(stream, "heartbeat")
                if beat.readiness.reason == pb.READINESS_REASON_STALE:
                    break
        assert beat.last_sequence == 1
        stream.cancel()


async def test_cycle_messages_carry_readiness_as_of_each_cycle(harness: ServerHarness) -> None:
    """Each cycle message carries the verdict right after it: READY, CYCLE_FAILED, READY."""
    async with harness.channel() as channel:
        stream = pb_grpc.NodeHealthServiceStub(channel).Watch(
            pb.WatchRequest(heartbeat_interval=Duration(seconds=60))
        )
        await next_event(stream, "snapshot")
        reasons = []
        for gpus in ([ok(0), ok(1), ok(2)], [failed(0), ok(1), ok(2)], [ok(0), ok(1), ok(2)]):
            harness.publish(gpus)
            reasons.append((await next_event(stream, "cycle")).readiness.reason)
        stream.cancel()
    assert reasons == [
        pb.READINESS_REASON_READY,
        pb.READINESS_REASON_CYCLE_FAILED,
        pb.READINESS_REASON_READY,
    ]


async def test_dra_device_name_template_names_gpus_in_snapshots() -> None:
    """--dra-device-name '{uuid}': dra_device_name is the lower-cased UUID, before and after."""
    settings = settings_for(extra={"dra_device_name": "{uuid}"})
    async with running(settings=settings) as harness:
        before = await snapshot_of(harness)
        harness.publish()
        after = await snapshot_of(harness)
    expected = [u.lower() for u in UUIDS]
    assert [d.dra_device_name for d in before.devices] == expected
    assert [d.dra_device_name for d in after.devices] == expected
    assert [d.dra_device_name for d in after.last_cycle.devices] == expected


async def test_get_snapshot_after_stop_fails(harness: ServerHarness) -> None:
    """Once the server has stopped, GetSnapshot is UNAVAILABLE rather than a stale answer."""
    await harness.server.stop()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await snapshot_of(harness)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
