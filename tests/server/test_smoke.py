"""A first end-to-end check of the harness: snapshot, then the cycles published."""

from __future__ import annotations

import pytest

from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.api.gen.capwatch.v1 import node_health_pb2_grpc as pb_grpc
from tests.server.harness import ServerHarness

pytestmark = pytest.mark.asyncio


async def test_watch_sends_snapshot_then_each_cycle(harness: ServerHarness):
    """The first message is a full snapshot; each published cycle follows in order."""
    async with harness.channel() as channel:
        stub = pb_grpc.NodeHealthServiceStub(channel)
        stream = stub.Watch(pb.WatchRequest())
        first = await stream.read()
        assert first.WhichOneof("event") == "snapshot"
        assert first.snapshot.node_name == "node-under-test"
        assert len(first.snapshot.devices) == 3
        assert {d.health for d in first.snapshot.devices} == {pb.DEVICE_HEALTH_UNKNOWN}
        harness.publish()
        harness.publish()
        seqs = []
        while len(seqs) < 2:
            message = await stream.read()
            if message.WhichOneof("event") == "cycle":
                seqs.append(message.cycle.sequence)
        assert seqs == [1, 2]
        stream.cancel()
