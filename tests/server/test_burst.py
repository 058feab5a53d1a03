"""A burst of thousands of new streams (every controller reconnecting at once) all succeed.

grpc core fails calls beyond ``grpc.server.max_pending_requests`` (1000 by
default) that are not yet matched to a handler; the server raises that limit.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.api.gen.capwatch.v1 import node_health_pb2_grpc as pb_grpc
from tests.server.harness import ServerHarness, running, settings_for

pytestmark = pytest.mark.asyncio

STREAMS = 2500
CHANNELS = 5


async def test_thousands_of_streams_opened_at_once_all_get_their_snapshot():
    """2,500 Watch calls started together on a few connections all receive a snapshot
    (from one address: the limit per address is raised to let them)."""
    settings = settings_for(extra={"grpc_max_streams_per_peer": str(STREAMS)})
    async with running(settings=settings) as harness:
        await _burst(harness)


async def _burst(harness: ServerHarness) -> None:
    harness.publish()
    channels = [grpc.aio.insecure_channel(harness.target) for _ in range(CHANNELS)]
    calls = []
    try:
        for i in range(STREAMS):
            stub = pb_grpc.NodeHealthServiceStub(channels[i % CHANNELS])
            calls.append(stub.Watch(pb.WatchRequest()))
        first = await asyncio.wait_for(asyncio.gather(*(c.read() for c in calls)), 45)
        assert all(m.WhichOneof("event") == "snapshot" for m in first)
        assert harness.publication.subscribers == STREAMS
    finally:
        for call in calls:
            call.cancel()
        for channel in channels:
            await channel.close()
