"""The cluster stream: one update per real change (not per cycle), snapshots in pages,
paged GetClusterSnapshot, resume by instance and sequence, resync otherwise; over a real
gRPC server on port 0 with a real client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio

from capwatch.api.gen.capwatch.v1 import cluster_health_pb2 as cpb
from capwatch.api.gen.capwatch.v1 import cluster_health_pb2_grpc as cpb_grpc
from capwatch.controller.cluster.serving import ClusterServer
from capwatch.controller.cluster.state import ClusterView
from capwatch.controller.conditions import AgentLink, NodeObservation, condition_of
from capwatch.controller.tracking import NodeState
from capwatch.kit.clock import FakeClock
from tests.controller.builders import cycle, failed_gpu, gpu

pytestmark = pytest.mark.asyncio(loop_factories=["real"])


def state(node: str, *, enforced: bool = True, sequence: int = 1, at: float = 100.0) -> NodeState:
    gpus = (gpu(0), gpu(1)) if enforced else (gpu(0), failed_gpu(1, "write_failed"))
    observation = NodeObservation(
        node=node,
        link=AgentLink.CONNECTED,
        address="10.0.0.1:50051",
        stale_after_s=45.0,
        cycle=cycle(enforced=enforced, gpus=gpus, sequence=sequence, finished_at=at),
        gpus=gpus,
    )
    return NodeState(observation=observation, condition=condition_of(observation, at))


@pytest_asyncio.fixture
async def served() -> AsyncIterator[tuple[ClusterView, str]]:
    view = ClusterView(clock=FakeClock(monotonic=100.0))
    server = ClusterServer(view=view, listen="127.0.0.1:0", ready=lambda: True)
    await server.start()
    try:
        yield view, server.address
    finally:
        await server.stop()


async def test_a_cycle_that_changes_nothing_shown_publishes_nothing() -> None:
    """A new cycle with the same outcome (its sequence and age moved) is no news; a failure
    is one update; its removal is one more."""
    view = ClusterView(clock=FakeClock(monotonic=100.0))
    view.node_changed(state("a", sequence=1))
    assert view.sequence == 1
    for sequence in range(2, 20):
        view.node_changed(state("a", sequence=sequence, at=100.0 + sequence))
    assert view.sequence == 1
    view.node_changed(state("a", enforced=False, sequence=20))
    assert view.sequence == 2
    view.node_removed("a")
    assert view.sequence == 3
    view.node_removed("a")
    assert view.sequence == 3


async def test_snapshots_come_in_pages_with_more_on_all_but_the_last() -> None:
    """2,500 nodes in pages of 1,000: three messages, every node once, in name order, the
    same header on each; an empty shard is one empty page."""
    view = ClusterView(clock=FakeClock(monotonic=100.0))
    assert [len(p.nodes) for p in view.snapshot()] == [0]
    for i in range(2500):
        view.node_changed(state(f"n{i:04d}"))
    pages = view.snapshot()
    assert [len(p.nodes) for p in pages] == [1000, 1000, 500]
    assert [p.more for p in pages] == [True, True, False]
    names = [n.node_name for p in pages for n in p.nodes]
    assert names == sorted(f"n{i:04d}" for i in range(2500))
    assert {(p.sequence, p.controller_instance_id) for p in pages} == {(2500, view.instance_id)}


async def test_get_cluster_snapshot_pages_through_every_node(
    served: tuple[ClusterView, str],
) -> None:
    """page_size and next_page_token visit every node once; a token from another instance
    and an oversized page are INVALID_ARGUMENT."""
    view, address = served
    for i in range(25):
        view.node_changed(state(f"n{i:02d}"))
    seen: list[str] = []
    token = ""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = cpb_grpc.ClusterHealthServiceStub(channel)
        while True:
            answer = await stub.GetClusterSnapshot(
                cpb.GetClusterSnapshotRequest(page_size=10, page_token=token)
            )
            seen += [n.node_name for n in answer.snapshot.nodes]
            token = answer.next_page_token
            if not token:
                break
        assert seen == [f"n{i:02d}" for i in range(25)]
        for bad in (
            cpb.GetClusterSnapshotRequest(page_token="another-instance/n05"),  # noqa: S106
            cpb.GetClusterSnapshotRequest(page_size=5001),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await stub.GetClusterSnapshot(bad)
            assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT


async def _read(
    call: grpc.aio.UnaryStreamCall, count: int
) -> list[cpb.ClusterHealthServiceWatchResponse]:  # type: ignore[type-arg]
    messages = []
    async with asyncio.timeout(10):
        while len(messages) < count:
            messages.append(await call.read())
    return messages


async def test_watch_sends_the_snapshot_then_changes_and_resumes(
    served: tuple[ClusterView, str],
) -> None:
    """A new stream gets the snapshot, then an update per change; a stream resuming after
    sequence N of this instance gets exactly the updates after N; another instance's
    sequence gets a snapshot marked resync."""
    view, address = served
    view.node_changed(state("a"))
    view.node_changed(state("b"))
    async with grpc.aio.insecure_channel(address) as channel:
        stub = cpb_grpc.ClusterHealthServiceStub(channel)
        call = stub.Watch(cpb.ClusterHealthServiceWatchRequest())
        [first] = await _read(call, 1)
        assert [n.node_name for n in first.snapshot.nodes] == ["a", "b"]
        assert (first.snapshot.sequence, first.snapshot.more) == (2, False)
        view.node_changed(state("b", enforced=False))
        [update] = await _read(call, 1)
        assert (update.update.sequence, update.update.node.node_name) == (3, "b")
        assert update.update.node.condition.status == cpb.CONDITION_STATUS_FALSE
        call.cancel()

        view.node_changed(state("a", enforced=False))
        resumed = stub.Watch(
            cpb.ClusterHealthServiceWatchRequest(
                since_sequence=2, controller_instance_id=view.instance_id
            )
        )
        got = await _read(resumed, 2)
        assert [m.update.sequence for m in got] == [3, 4]
        resumed.cancel()

        other = stub.Watch(
            cpb.ClusterHealthServiceWatchRequest(since_sequence=2, controller_instance_id="old")
        )
        [again] = await _read(other, 1)
        assert again.snapshot.resync
        assert again.snapshot.sequence == 4
        other.cancel()
