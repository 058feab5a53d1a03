"""Subscribers that stop reading are sent almost nothing and never queue without bound.

What they cost the publishing cycle in time is a benchmark's, not a unit test's:
bench/scenarios/stream.py's cycle-cost part times the real cycle with 1,000 frozen and 1,000
never-reading subscribers against phases without any, in the same run.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from capwatch.agent.reports import CapSource, GpuResult, Outcome, Reason
from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.api.gen.capwatch.v1 import node_health_pb2_grpc as pb_grpc
from tests.server.harness import POD, ServerHarness, eventually, running

pytestmark = pytest.mark.asyncio

GPUS = 64  # a big node, so each cycle message is ~25 KB and windows fill fast
CYCLES = 200
STUCK = 50
RING = 16  # the harness's ring capacity
# A client that never reads: no BDP probing (which would grow the window to
# megabytes) and a small per-stream lookahead, so the server's writes block
# after a message or two instead of after hundreds.
STUCK_OPTIONS = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)]


def big_cycle() -> list[GpuResult]:
    return [
        GpuResult(
            index=i,
            uuid=f"GPU-00000000-0000-4000-8000-{i:012d}",
            outcome=Outcome.ENFORCED,
            reason=Reason.OK,
            message=f"capped at 350 W (annotation) on a node with many pods {'-' * 160}",
            owners=(POD,) * 4,
            requested_watts=350,
            resolved_watts=350,
            applied_watts=350,
            cap_source=CapSource.ANNOTATION,
            process_count=4,
        )
        for i in range(GPUS)
    ]


async def publish_cycles(harness: ServerHarness, gpus: list[GpuResult]) -> None:
    """Publish CYCLES cycles; the loop runs the streams in between."""
    for _ in range(CYCLES):
        harness.publish(gpus)
        await asyncio.sleep(0)


async def follow(stream: Any, last: int) -> int:
    """Read until sequence ``last`` is known; every cycle in order or a resync. Returns messages."""
    known, count = -1, 0
    async with asyncio.timeout(10):
        while known < last:
            message = await stream.read()
            count += 1
            kind = message.WhichOneof("event")
            if kind == "snapshot":
                assert known == -1 or message.snapshot.resync
                assert message.snapshot.sequence >= known
                known = message.snapshot.sequence
            elif kind == "cycle":
                assert message.cycle.sequence == known + 1, "a cycle was skipped"
                known = message.cycle.sequence
    return count


async def test_stuck_subscribers_neither_slow_publishing_nor_queue_without_bound() -> None:
    """50 streams that never read: they are sent a few messages each over 200 cycles (no
    per-cycle work for them), a reader keeps up, and the stuck resync later."""
    gpus = big_cycle()
    # Heartbeats at the 5 s interval: none during the test, so every message is counted.
    async with running(interval_s=5.0) as harness:
        await publish_cycles(harness, gpus)
        assert harness.publication.messages_sent == 0

        stuck_channel = grpc.aio.insecure_channel(harness.target, options=STUCK_OPTIONS)
        healthy_channel = harness.channel()
        stuck = [
            pb_grpc.NodeHealthServiceStub(stuck_channel).Watch(pb.WatchRequest())
            for _ in range(STUCK)
        ]
        healthy = pb_grpc.NodeHealthServiceStub(healthy_channel).Watch(
            pb.WatchRequest(heartbeat_interval=Duration(seconds=60))
        )

        async def subscribed() -> bool:
            return harness.publication.subscribers == STUCK + 1

        await eventually(subscribed)
        reader = asyncio.create_task(follow(healthy, 2 * CYCLES))
        await publish_cycles(harness, gpus)
        healthy_received = await reader

        # The stuck really are stuck: a few messages each (their ~50 KB snapshot fills
        # the window), where a reader is sent something for every cycle.
        stuck_sent = harness.publication.messages_sent - healthy_received
        assert STUCK <= stuck_sent <= STUCK * 4, f"{stuck_sent} messages to streams that never read"

        # A stuck stream that reads again gets what was in flight, at most one ring of
        # stale cycles, then a resync snapshot of now: no backlog of 200 cycles.
        late = stuck[0]
        count = 0
        async with asyncio.timeout(5):
            while True:
                message = await late.read()
                count += 1
                if message.WhichOneof("event") == "snapshot" and message.snapshot.resync:
                    break
                assert count <= RING + 4, "a stream that fell 200 cycles behind did not resync"
        assert message.snapshot.sequence == 2 * CYCLES
        assert len(message.snapshot.devices) == GPUS

        for call in [*stuck, healthy]:
            call.cancel()
        await stuck_channel.close()
        await healthy_channel.close()
