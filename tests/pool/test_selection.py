"""server/grpc/nodes.py over a real pool server on 127.0.0.1:0: the node a request names is the
node served, a request naming none or an unknown one is refused, and a silent or vanished
node's streams end while every other node's go on."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
import pytest_asyncio

from capwatch.agent.sim.pool import Pool, PoolNode, PoolSettings
from capwatch.agent.sim.poolspec import PoolFaultKind
from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.api.gen.capwatch.v1 import node_health_pb2_grpc as pb_grpc
from capwatch.api.gen.v1 import dra_health_pb2 as v1_pb
from capwatch.api.gen.v1 import dra_health_pb2_grpc as v1_grpc
from capwatch.api.gen.v1alpha1 import dra_health_pb2 as v1alpha1_pb
from capwatch.api.gen.v1alpha1 import dra_health_pb2_grpc as v1alpha1_grpc
from capwatch.kit.clock import SystemClock
from capwatch.pool import node_state, pool_server_settings, served_nodes
from capwatch.server.grpc.nodes import NODE_METADATA_KEY, ManyNodes, NodeState
from capwatch.server.grpc.serving import AgentServer
from capwatch.watch.command import watch
from capwatch.watch.settings import add_watch_arguments, watch_settings
from tests.server.harness import next_event

NONE: frozenset[PoolFaultKind] = frozenset()
FAILING = frozenset({PoolFaultKind.WRITE_FAILED})


@dataclass
class PoolServer:
    """A pool whose nodes the test cycles by hand, served as ``capwatch pool`` serves it."""

    pool: Pool
    nodes: ManyNodes
    server: AgentServer
    channel: grpc.aio.Channel

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.pool.names())

    def node(self, index: int) -> PoolNode:
        return self.pool.nodes[self.names[index]]

    @property
    def stub(self) -> pb_grpc.NodeHealthServiceStub:
        return pb_grpc.NodeHealthServiceStub(self.channel)


@contextlib.asynccontextmanager
async def serving(interval_s: float) -> AsyncIterator[PoolServer]:
    """Three nodes of two GPUs on a real server; no cycle yet."""
    clock = SystemClock()
    pool = Pool(PoolSettings(nodes=3, gpus=2, interval_s=interval_s), clock=clock)
    settings = pool_server_settings(("127.0.0.1:0",))
    nodes = served_nodes(pool, clock=clock, namer=settings.device_namer())
    server = AgentServer(settings=settings, nodes=nodes)
    await server.start()
    channel = grpc.aio.insecure_channel(server.addresses[0])
    try:
        yield PoolServer(pool=pool, nodes=nodes, server=server, channel=channel)
    finally:
        await channel.close()
        await server.stop()


@pytest_asyncio.fixture
async def served() -> AsyncIterator[PoolServer]:
    """Three nodes, interval 0.5 s (stale after 1.5 s)."""
    async with serving(0.5) as started:
        yield started


async def refusal(call: Any) -> grpc.aio.AioRpcError:
    """The error a call ends with (a unary call's, or a stream's first read's)."""
    waiting = call.read() if hasattr(call, "read") else call
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await waiting
    return raised.value


@pytest.mark.asyncio
async def test_watch_and_get_snapshot_serve_the_node_the_request_names(
    served: PoolServer,
) -> None:
    """Each node name gets that node's own snapshot: its name, its agent instance, its
    sequence, its GPUs (node 1 failing, the others enforced)."""
    served.node(0).cycle(NONE)
    served.node(1).cycle(FAILING)
    served.node(1).cycle(FAILING)
    for index, name in enumerate(served.names):
        hub = served.node(index).hub
        first = await served.stub.Watch(pb.WatchRequest(node_name=name)).read()
        answer = (await served.stub.GetSnapshot(pb.GetSnapshotRequest(node_name=name))).snapshot
        for snapshot in (first.snapshot, answer):
            assert snapshot.node_name == name
            assert snapshot.agent_instance_id == hub.instance_id
            assert snapshot.sequence == hub.state().sequence
            uuids = {g.uuid for g in served.node(index).world.scenario.gpus}
            assert {d.uuid for d in snapshot.devices} == uuids
        assert first.snapshot.sequence == [1, 2, 0][index]
        assert first.snapshot.readiness.ready is (index == 0)


@pytest.mark.asyncio
async def test_a_stream_carries_only_its_own_nodes_cycles(served: PoolServer) -> None:
    """A Watch on node 0 gets node 0's cycles and nothing of node 1's, which cycles in
    between (each node has its own broadcast)."""
    stream = served.stub.Watch(pb.WatchRequest(node_name=served.names[0]))
    await next_event(stream, "snapshot")
    served.node(1).cycle(FAILING)
    served.node(0).cycle(NONE)
    served.node(1).cycle(FAILING)
    served.node(0).cycle(NONE)
    cycles = [await next_event(stream, "cycle") for _ in range(2)]
    assert [c.sequence for c in cycles] == [1, 2]
    assert all(c.enforced for c in cycles)
    mine = {g.uuid for g in served.node(0).world.scenario.gpus}
    assert all({d.uuid for d in c.devices} == mine for c in cycles)
    stream.cancel()


@pytest.mark.asyncio
async def test_a_request_naming_no_node_is_invalid(served: PoolServer) -> None:
    """In a pool a request must say which node: Watch, GetSnapshot and the DRA mirrors
    (without the metadata key) answer INVALID_ARGUMENT saying how to name one."""
    calls = [
        served.stub.Watch(pb.WatchRequest()),
        served.stub.GetSnapshot(pb.GetSnapshotRequest()),
        v1_grpc.DRAResourceHealthStub(served.channel).NodeWatchResources(
            v1_pb.NodeWatchResourcesRequest()
        ),
    ]
    for call in calls:
        error = await refusal(call)
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert error.details() == (
            "this is a pool of 3 simulated nodes: name one "
            f"(node_name, or the {NODE_METADATA_KEY} metadata key)"
        )


@pytest.mark.asyncio
async def test_a_request_naming_an_unknown_node_is_not_found(served: PoolServer) -> None:
    """A name the pool does not hold is NOT_FOUND, for every service; the others still serve."""
    metadata = ((NODE_METADATA_KEY, "elsewhere"),)
    calls = [
        served.stub.Watch(pb.WatchRequest(node_name="elsewhere")),
        served.stub.GetSnapshot(pb.GetSnapshotRequest(node_name="elsewhere")),
        v1_grpc.DRAResourceHealthStub(served.channel).NodeWatchResources(
            v1_pb.NodeWatchResourcesRequest(), metadata=metadata
        ),
        v1alpha1_grpc.DRAResourceHealthStub(served.channel).NodeWatchResources(
            v1alpha1_pb.NodeWatchResourcesRequest(), metadata=metadata
        ),
    ]
    for call in calls:
        error = await refusal(call)
        assert error.code() is grpc.StatusCode.NOT_FOUND
        assert error.details() == "no node 'elsewhere' in this pool"
    answer = await served.stub.GetSnapshot(pb.GetSnapshotRequest(node_name=served.names[2]))
    assert answer.snapshot.node_name == served.names[2]


@pytest.mark.asyncio
async def test_dra_streams_select_the_node_by_the_metadata_key(served: PoolServer) -> None:
    """NodeWatchResources (v1 and v1alpha1) names its node in the capwatch-node metadata key:
    the devices sent are that node's, pooled under its name, unhealthy where it fails."""
    served.node(0).cycle(NONE)
    served.node(2).cycle(FAILING)
    for stub, pb_dra in (
        (v1_grpc.DRAResourceHealthStub(served.channel), v1_pb),
        (v1alpha1_grpc.DRAResourceHealthStub(served.channel), v1alpha1_pb),
    ):
        for index in (0, 2):
            name = served.names[index]
            call = stub.NodeWatchResources(
                pb_dra.NodeWatchResourcesRequest(), metadata=((NODE_METADATA_KEY, name),)
            )
            first = await call.read()
            call.cancel()
            assert [(d.device.pool_name, d.device.device_name) for d in first.devices] == [
                (name, "gpu-0"),
                (name, "gpu-1"),
            ]
            health = [d.health for d in first.devices]
            healthy, unhealthy = pb_dra.HEALTHY, pb_dra.UNHEALTHY
            assert health == ([healthy, healthy] if index == 0 else [unhealthy, healthy])


@pytest.mark.asyncio
async def test_a_silent_node_ends_its_streams_and_refuses_new_ones(served: PoolServer) -> None:
    """A node gone silent: its open Watch and DRA streams end, a new Watch or GetSnapshot is
    UNAVAILABLE; the other nodes' streams go on. Serving again, it answers as before."""
    quiet, other = served.names[0], served.names[1]
    served.node(0).cycle(NONE)
    served.node(1).cycle(NONE)
    watch = served.stub.Watch(pb.WatchRequest(node_name=quiet))
    dra = v1_grpc.DRAResourceHealthStub(served.channel).NodeWatchResources(
        v1_pb.NodeWatchResourcesRequest(), metadata=((NODE_METADATA_KEY, quiet),)
    )
    bystander = served.stub.Watch(pb.WatchRequest(node_name=other))
    await next_event(watch, "snapshot")
    await dra.read()
    await next_event(bystander, "snapshot")

    served.nodes.set_state(quiet, NodeState.SILENT)
    async with asyncio.timeout(5):
        while (await watch.read()) is not grpc.aio.EOF:
            pass
        while (await dra.read()) is not grpc.aio.EOF:
            pass
    for call in (
        served.stub.Watch(pb.WatchRequest(node_name=quiet)),
        served.stub.GetSnapshot(pb.GetSnapshotRequest(node_name=quiet)),
    ):
        error = await refusal(call)
        assert error.code() is grpc.StatusCode.UNAVAILABLE
        assert error.details() == f"node {quiet!r} is silent"
    served.node(1).cycle(NONE)
    assert (await next_event(bystander, "cycle")).sequence == 2
    bystander.cancel()

    served.nodes.set_state(quiet, NodeState.SERVING)
    again = served.stub.Watch(pb.WatchRequest(node_name=quiet))
    assert (await next_event(again, "snapshot")).sequence == 1
    served.node(0).cycle(NONE)
    assert (await next_event(again, "cycle")).sequence == 2
    again.cancel()


@pytest.mark.asyncio
async def test_a_silent_node_ends_its_streams_now_not_an_interval_later() -> None:
    """With a 30 s interval, a node gone silent ends its Watch and DRA streams at once: a
    DRA stream waiting for the next cycle (or its re-send, an interval away) is woken."""
    async with serving(30.0) as served:
        quiet = served.names[0]
        served.node(0).cycle(NONE)
        watch = served.stub.Watch(pb.WatchRequest(node_name=quiet))
        dra = v1alpha1_grpc.DRAResourceHealthStub(served.channel).NodeWatchResources(
            v1alpha1_pb.NodeWatchResourcesRequest(), metadata=((NODE_METADATA_KEY, quiet),)
        )
        await next_event(watch, "snapshot")
        await dra.read()
        served.nodes.set_state(quiet, NodeState.SILENT)
        async with asyncio.timeout(5):
            assert await watch.read() is grpc.aio.EOF
            assert await dra.read() is grpc.aio.EOF


@pytest.mark.asyncio
@pytest.mark.parametrize("turns", range(8))
async def test_a_node_gone_silent_while_its_stream_sends_still_ends_it(turns: int) -> None:
    """The node goes silent a few event-loop turns after a cycle, while its Watch stream is
    busy sending that cycle rather than waiting (the nudge finds no one waiting): the
    stream still ends once it has sent what it had, not at its next heartbeat (45 s
    away at a 30 s interval)."""
    async with serving(30.0) as served:
        quiet = served.names[0]
        served.node(0).cycle(NONE)
        watch = served.stub.Watch(pb.WatchRequest(node_name=quiet))
        await next_event(watch, "snapshot")
        served.node(0).cycle(NONE)
        for _ in range(turns):
            await asyncio.sleep(0)
        served.nodes.set_state(quiet, NodeState.SILENT)
        async with asyncio.timeout(5):
            while (message := await watch.read()) is not grpc.aio.EOF:
                assert message.WhichOneof("event") == "cycle"


@pytest.mark.asyncio
async def test_a_vanished_node_is_not_found_until_it_returns(served: PoolServer) -> None:
    """A vanished node's open stream ends and it answers NOT_FOUND as if it never existed;
    back, it serves its own sequence on from where it was."""
    gone = served.names[2]
    served.node(2).cycle(NONE)
    watch = served.stub.Watch(pb.WatchRequest(node_name=gone))
    await next_event(watch, "snapshot")
    served.nodes.set_state(gone, NodeState.VANISHED)
    async with asyncio.timeout(5):
        while (await watch.read()) is not grpc.aio.EOF:
            pass
    error = await refusal(served.stub.GetSnapshot(pb.GetSnapshotRequest(node_name=gone)))
    assert error.code() is grpc.StatusCode.NOT_FOUND
    served.nodes.set_state(gone, NodeState.SERVING)
    answer = await served.stub.GetSnapshot(pb.GetSnapshotRequest(node_name=gone))
    assert answer.snapshot.sequence == 1


@pytest.mark.asyncio
async def test_a_hung_node_keeps_its_stream_with_heartbeats_going_stale(
    served: PoolServer,
) -> None:
    """A hung node completes no cycle but still answers: its stream stays up and its
    heartbeats say it is no longer ready once the staleness bound (1.5 s) has passed."""
    served.node(0).cycle(NONE)
    watch = served.stub.Watch(pb.WatchRequest(node_name=served.names[0]))
    assert (await next_event(watch, "snapshot")).readiness.ready
    served.node(0).cycle(frozenset({PoolFaultKind.HANG}))  # skipped: nothing published
    async with asyncio.timeout(10):
        while (heartbeat := await next_event(watch, "heartbeat", timeout=5)).readiness.ready:
            pass
    assert heartbeat.last_sequence == 1
    watch.cancel()


@pytest.mark.parametrize(
    ("kinds", "state"),
    [
        (NONE, NodeState.SERVING),
        (FAILING, NodeState.SERVING),
        (frozenset({PoolFaultKind.HANG}), NodeState.SERVING),
        (frozenset({PoolFaultKind.SILENT}), NodeState.SILENT),
        (frozenset({PoolFaultKind.VANISH}), NodeState.VANISHED),
        (frozenset({PoolFaultKind.SILENT, PoolFaultKind.VANISH}), NodeState.VANISHED),
    ],
)
def test_how_a_faulty_node_is_served(kinds: frozenset[PoolFaultKind], state: NodeState) -> None:
    """Only silent and vanish change how a node is served; vanish wins over silent."""
    assert node_state(kinds) is state


@pytest.mark.asyncio
async def test_capwatch_watch_follows_a_pool_node_named_with_node(served: PoolServer) -> None:
    """``capwatch watch --node NAME`` follows that node of a pool (its snapshot names it);
    without --node the pool refuses the stream, and watch exits 1 saying why."""

    def parsed(*argv: str) -> Any:
        parser = argparse.ArgumentParser()
        add_watch_arguments(parser)
        return watch_settings(parser.parse_args(list(argv)), {})

    target = served.server.addresses[0]
    name = served.names[1]
    out, err = io.StringIO(), io.StringIO()
    async with asyncio.timeout(10):
        rc = await watch(
            parsed("--target", target, "--node", name, "--json", "--count", "1"), out=out, err=err
        )
    assert rc == 0
    assert f'"node_name": "{name}"' in out.getvalue()
    out, err = io.StringIO(), io.StringIO()
    async with asyncio.timeout(10):
        rc = await watch(parsed("--target", target, "--json", "--count", "1"), out=out, err=err)
    assert rc == 1
    assert "INVALID_ARGUMENT" in err.getvalue()


@pytest.mark.asyncio
async def test_every_node_is_served_on_every_listen_address() -> None:
    """A pool listening on several loopback addresses (each a node's own pod IP in a KWOK
    cluster) serves any of its nodes on any of them: the request's node_name selects."""
    clock = SystemClock()
    pool = Pool(PoolSettings(nodes=3, gpus=2, interval_s=0.5), clock=clock)
    settings = pool_server_settings(("127.0.0.1:0", "127.1.0.1:0", "127.1.0.2:0"))
    nodes = served_nodes(pool, clock=clock, namer=settings.device_namer())
    server = AgentServer(settings=settings, nodes=nodes)
    await server.start()
    try:
        assert {a.rsplit(":", 1)[0] for a in server.addresses} == {
            "127.0.0.1",
            "127.1.0.1",
            "127.1.0.2",
        }
        for address, name in zip(server.addresses, reversed(pool.names()), strict=True):
            async with grpc.aio.insecure_channel(address) as channel:
                stub = pb_grpc.NodeHealthServiceStub(channel)
                first = await stub.Watch(pb.WatchRequest(node_name=name)).read()
                assert first.snapshot.node_name == name
    finally:
        await server.stop()
