"""The node a client expects: an agent refuses a stream or snapshot meant for another node."""

from __future__ import annotations

import grpc
import pytest

from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.api.gen.capwatch.v1 import node_health_pb2_grpc as pb_grpc
from capwatch.client.node_health import ClientError, Disconnected, NodeHealthClient, Snapshot
from tests.server.harness import NODE, ServerHarness

pytestmark = pytest.mark.asyncio


async def test_a_watch_for_another_node_is_refused(harness: ServerHarness) -> None:
    """Watch with node_name naming another node ends at once with FAILED_PRECONDITION,
    saying which node this agent serves (a recycled pod IP reports nothing)."""
    harness.publish()
    async with grpc.aio.insecure_channel(harness.target) as channel:
        call = pb_grpc.NodeHealthServiceStub(channel).Watch(pb.WatchRequest(node_name="elsewhere"))
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call.read()
    assert raised.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert f"serves node {NODE!r}, not 'elsewhere'" in (raised.value.details() or "")


async def test_the_right_node_or_none_is_served(harness: ServerHarness) -> None:
    """The agent's own node name, or none at all, gets the snapshot as before."""
    harness.publish()
    async with grpc.aio.insecure_channel(harness.target) as channel:
        stub = pb_grpc.NodeHealthServiceStub(channel)
        for name in (NODE, ""):
            first = await stub.Watch(pb.WatchRequest(node_name=name)).read()
            assert first.snapshot.node_name == NODE
            answer = await stub.GetSnapshot(pb.GetSnapshotRequest(node_name=name))
            assert answer.snapshot.node_name == NODE


async def test_the_client_library_names_its_node_and_reports_the_refusal(
    harness: ServerHarness,
) -> None:
    """NodeHealthClient(node_name=...) sends it: a mismatch is a Disconnected with
    FAILED_PRECONDITION (a controller marks the node unreachable), GetSnapshot a ClientError."""
    harness.publish()
    async with NodeHealthClient(target=harness.target, node_name="elsewhere") as client:
        events = client.events()
        first = await anext(events)
        await events.aclose()
        assert isinstance(first, Disconnected)
        assert first.code is grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(ClientError) as raised:
            await client.snapshot()
        assert raised.value.code is grpc.StatusCode.FAILED_PRECONDITION
    async with NodeHealthClient(target=harness.target, node_name=NODE) as client:
        events = client.events()
        assert isinstance(await anext(events), Snapshot)
        await events.aclose()
