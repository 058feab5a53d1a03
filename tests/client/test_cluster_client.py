"""ClusterHealthClient against the controller's real cluster stream: order, resume,
resync, backoff, silence, close, and the unary snapshot."""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import AsyncGenerator, AsyncIterator, Iterator

import grpc
import pytest
import pytest_asyncio

from capwatch.api.gen.capwatch.v1 import cluster_health_pb2 as cpb
from capwatch.client.cluster_health import (
    CONTROLLER_HEARTBEAT_S,
    ClientError,
    ClusterEvent,
    ClusterHealthClient,
    ClusterHeartbeat,
    ClusterSnapshot,
    Disconnected,
    NodeUpdate,
)
from capwatch.controller.cluster.serving import DEFAULT_HEARTBEAT_S
from capwatch.controller.conditions import AgentLink
from capwatch.kit.backoff import Backoff
from capwatch.kit.clock import FakeClock
from capwatch.kit.errors import ConfigError
from tests.client.cluster_rig import ClusterRig, new_view, start_rig
from tests.client.support import eventually

pytestmark = pytest.mark.asyncio

TINY = Backoff(initial_s=0.001, max_s=0.004, multiplier=2)


@pytest_asyncio.fixture
async def rigs() -> AsyncIterator[list[ClusterRig]]:
    """Rigs a test starts (or serves again) go here; all are stopped after."""
    started: list[ClusterRig] = []
    yield started
    for rig in started:
        await rig.stop()


@pytest_asyncio.fixture
async def rig(rigs: list[ClusterRig]) -> ClusterRig:
    """A controller's cluster stream on 127.0.0.1:0 with two nodes: gpu-a enforced, gpu-b
    failing (updates 1 and 2)."""
    started = await start_rig()
    rigs.append(started)
    started.set("gpu-b", failing=(1,))
    started.set("gpu-a")
    return started


@pytest.fixture
def closed_port() -> Iterator[str]:
    """A port bound but not listening: every connection is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{sock.getsockname()[1]}"


async def next_of(events: AsyncGenerator[ClusterEvent, None], *kinds: type) -> ClusterEvent:
    """The next event of one of ``kinds``, skipping others (within 5 s)."""
    async with asyncio.timeout(5):
        async for event in events:
            if isinstance(event, kinds):
                return event
    raise AssertionError("stream ended")


async def test_snapshot_then_updates_in_order_then_heartbeats(rig: ClusterRig):
    """A snapshot of every node by name (not a resync), then one update per changed node
    in sequence order, then a heartbeat naming the last update; position follows."""
    async with ClusterHealthClient(target=rig.target, heartbeat_interval=1) as client:
        events = client.events()
        first = await anext(events)
        assert isinstance(first, ClusterSnapshot)
        assert (first.resync, first.restarted) == (False, False)
        assert [n.node_name for n in first.snapshot.nodes] == ["gpu-a", "gpu-b"]
        assert first.snapshot.controller_instance_id == rig.view.instance_id
        assert first.snapshot.sequence == 2
        rig.set("gpu-b")  # recovers: update 3
        rig.set("gpu-c", link=AgentLink.MISSING)  # discovered: update 4
        updates = [await anext(events), await anext(events)]
        assert all(isinstance(u, NodeUpdate) for u in updates)
        assert [(u.update.sequence, u.update.node.node_name) for u in updates] == [
            (3, "gpu-b"),
            (4, "gpu-c"),
        ]
        beat = await anext(events)
        assert isinstance(beat, ClusterHeartbeat)
        assert beat.heartbeat.last_sequence == 4
        assert client.position.sequence == 4
        assert client.position.instance_id == rig.view.instance_id
        await events.aclose()


async def test_a_cut_resumes_with_exactly_the_missed_updates(
    rig: ClusterRig, rigs: list[ClusterRig]
):
    """The server goes away and comes back (the same controller): one Disconnected, then
    exactly the updates published meanwhile, no snapshot, none repeated."""
    async with ClusterHealthClient(target=rig.target, backoff=TINY) as client:
        events = client.events()
        assert isinstance(await anext(events), ClusterSnapshot)
        await rig.stop()
        lost = await anext(events)
        assert isinstance(lost, Disconnected)
        assert lost.attempt == 0
        rig.set("gpu-a", failing=(0,))
        rig.set("gpu-b")
        rigs.append(await rig.serve_again())
        got = [await next_of(events, NodeUpdate, ClusterSnapshot) for _ in range(2)]
        assert [type(e) for e in got] == [NodeUpdate, NodeUpdate]
        assert [e.update.sequence for e in got] == [3, 4]
        await events.aclose()


async def test_a_restarted_controller_answers_with_a_resync(
    rig: ClusterRig, rigs: list[ClusterRig]
):
    """A new controller instance on the same address: the client's resume is answered
    with a snapshot marked resync and restarted (sequences began again)."""
    async with ClusterHealthClient(target=rig.target, backoff=TINY) as client:
        events = client.events()
        assert isinstance(await anext(events), ClusterSnapshot)
        fresh = new_view(rig.clock)
        rigs.append(again := await rig.serve_again(view=fresh))
        again.set("gpu-a")
        resync = await next_of(events, ClusterSnapshot, NodeUpdate)
        assert isinstance(resync, ClusterSnapshot)
        assert (resync.resync, resync.restarted) == (True, True)
        assert resync.snapshot.controller_instance_id == fresh.instance_id
        assert client.position.instance_id == fresh.instance_id
        await events.aclose()


async def test_updates_no_longer_buffered_answer_with_a_resync(rigs: list[ClusterRig]):
    """More updates than the controller keeps while the client was away: a snapshot
    marked resync (the same instance: not restarted) replaces them."""
    small = await start_rig(view=(view := new_view(FakeClock(), capacity=2)))
    rigs.append(small)
    small.set("gpu-a")
    async with ClusterHealthClient(target=small.target, backoff=TINY) as client:
        events = client.events()
        assert isinstance(await anext(events), ClusterSnapshot)
        await small.stop()
        assert isinstance(await anext(events), Disconnected)
        for step in range(4):  # four updates into a ring of two
            small.set("gpu-a", failing=(step,))
        rigs.append(await small.serve_again())
        resync = await next_of(events, ClusterSnapshot, NodeUpdate)
        assert isinstance(resync, ClusterSnapshot)
        assert (resync.resync, resync.restarted) == (True, False)
        assert resync.snapshot.sequence == view.sequence == 5
        await events.aclose()


async def test_since_and_instance_resume_in_a_new_client(rig: ClusterRig):
    """A position saved from one client resumes in another: only the updates after it."""
    async with ClusterHealthClient(target=rig.target) as client:
        events = client.events(since=1, instance_id=rig.view.instance_id)
        first = await anext(events)
        assert isinstance(first, NodeUpdate)
        assert (first.update.sequence, first.update.node.node_name) == (2, "gpu-a")
        await events.aclose()
    with pytest.raises(ConfigError, match="since: must not be negative"):
        ClusterHealthClient(target=rig.target).events(since=-1)


async def test_backoff_grows_is_capped_and_jittered(closed_port: str):
    """Each refused attempt waits uniform(0, min(max, initial*2**n)) from the given
    Random: the node client's backoff, from the same loop."""
    async with ClusterHealthClient(
        target=closed_port, backoff=TINY, rng=random.Random(7)
    ) as client:
        events = client.events()
        lost = [await next_of(events, Disconnected) for _ in range(5)]
        await events.aclose()
    expected_rng = random.Random(7)
    expected = [expected_rng.uniform(0, c) for c in (0.001, 0.002, 0.004, 0.004, 0.004)]
    assert [e.retry_in for e in lost] == expected
    assert [e.attempt for e in lost] == [0, 1, 2, 3, 4]
    assert {e.code for e in lost} == {grpc.StatusCode.UNAVAILABLE}


async def test_a_silent_stream_is_presumed_dead_and_resumed(rig: ClusterRig):
    """No message within silence_timeout: Disconnected (code None), then a resume from
    the last update, not a snapshot."""
    async with ClusterHealthClient(
        target=rig.target, heartbeat_interval=5, silence_timeout=0.2, backoff=TINY
    ) as client:
        events = client.events()
        assert isinstance(await anext(events), ClusterSnapshot)
        lost = await anext(events)
        assert isinstance(lost, Disconnected)
        assert lost.code is None
        assert "no message for 0.2s" in lost.error
        rig.set("gpu-b")
        resumed = await next_of(events, NodeUpdate, ClusterSnapshot)
        assert isinstance(resumed, NodeUpdate)
        assert resumed.update.sequence == 3
        await events.aclose()


async def test_a_stream_the_controller_ends_says_so(rig: ClusterRig):
    """The controller shutting down ends streams with OK: the client says the controller
    ended it, and keeps trying."""
    async with ClusterHealthClient(target=rig.target, backoff=TINY) as client:
        events = client.events()
        assert isinstance(await anext(events), ClusterSnapshot)
        rig.view.close()  # what ClusterServer.stop does first
        lost = await anext(events)
        assert isinstance(lost, Disconnected)
        assert (lost.code, lost.error) == (grpc.StatusCode.OK, "stream ended by the controller")
        await events.aclose()


async def test_close_ends_iteration_promptly_and_frees_the_stream(rig: ClusterRig):
    """close() ends a quiet stream at once, and the controller's subscriber slot is freed."""
    client = ClusterHealthClient(target=rig.target)
    received: list[ClusterEvent] = []

    async def consume() -> None:
        async for event in client.events():
            received.append(event)

    task = asyncio.create_task(consume())
    await eventually(lambda: received)
    assert rig.servicer.subscribers == 1
    await client.close()
    async with asyncio.timeout(5):  # a hang guard: unclosed, the quiet stream goes on for ever
        await task
    await eventually(lambda: rig.servicer.subscribers == 0)
    with pytest.raises(ClientError, match="client is closed"):
        await client.snapshot()


async def test_get_cluster_snapshot(rig: ClusterRig, closed_port: str):
    """snapshot() is GetClusterSnapshot: every node now; an unreachable controller is a
    ClientError naming the call and its status."""
    async with ClusterHealthClient(target=rig.target) as client:
        now = await client.snapshot()
    assert [n.node_name for n in now.nodes] == ["gpu-a", "gpu-b"]
    assert now.nodes[1].condition.status == cpb.CONDITION_STATUS_FALSE
    async with ClusterHealthClient(target=closed_port) as client:
        with pytest.raises(ClientError, match=r"GetClusterSnapshot from .*: UNAVAILABLE") as exc:
            await client.snapshot(deadline_s=2)
    assert exc.value.code is grpc.StatusCode.UNAVAILABLE


async def test_silence_is_judged_by_the_controllers_own_heartbeat_period():
    """With no heartbeat asked for, the client presumes the controller's default period
    (three of them and a second of silence is a dead stream): the two must agree."""
    assert CONTROLLER_HEARTBEAT_S == DEFAULT_HEARTBEAT_S
    client = ClusterHealthClient(target="127.0.0.1:1")
    assert client._silence() == 3 * DEFAULT_HEARTBEAT_S + 1


@pytest.mark.parametrize("heartbeat_s", [0.5, 3601.0])
async def test_heartbeats_the_controller_would_refuse_are_refused_first(heartbeat_s: float):
    """The controller's limits (1 s to 1 h) are checked before connecting."""
    with pytest.raises(ConfigError, match=r"heartbeat_interval: must be between 1\.0s and 3600s"):
        ClusterHealthClient(target="127.0.0.1:1", heartbeat_interval=heartbeat_s)


async def test_a_paged_snapshot_is_one_event_of_every_node(rigs: list[ClusterRig]):
    """A shard bigger than a page (1,000 nodes) comes in several snapshot messages, more
    set on all but the last: the client yields one snapshot of every node, in name order,
    keeping the pages as sent; updates follow it."""
    rig = await start_rig()
    rigs.append(rig)
    for i in range(2001):
        rig.set(f"node-{i:04d}", gpus=1)
    async with ClusterHealthClient(target=rig.target) as client:
        events = client.events()
        first = await anext(events)
        assert isinstance(first, ClusterSnapshot)
        names = [n.node_name for n in first.snapshot.nodes]
        assert names == [f"node-{i:04d}" for i in range(2001)]
        assert first.snapshot.more is False
        assert [(len(p.nodes), p.more) for p in first.pages] == [
            (1000, True),
            (1000, True),
            (1, False),
        ]
        assert client.position.sequence == 2001
        rig.set("node-0007", failing=(0,), gpus=1)
        update = await anext(events)
        assert isinstance(update, NodeUpdate)
        assert update.update.sequence == 2002
        await events.aclose()


async def test_a_snapshot_cut_short_is_never_applied():
    """A stream lost between a snapshot's pages: the pages received are dropped, and the
    next stream's snapshot alone is what the client yields (not a mix of the two)."""
    calls: list[int] = []

    async def watch(request: object, context: grpc.aio.ServicerContext) -> AsyncIterator[object]:
        calls.append(1)
        if len(calls) == 1:
            page = cpb.ClusterSnapshot(nodes=[cpb.NodeHealth(node_name="old")], more=True)
            yield cpb.ClusterHealthServiceWatchResponse(snapshot=page)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "cut")
        whole = cpb.ClusterSnapshot(nodes=[cpb.NodeHealth(node_name="new")], sequence=1)
        yield cpb.ClusterHealthServiceWatchResponse(snapshot=whole)
        await asyncio.Event().wait()

    server = grpc.aio.server()
    handler = grpc.unary_stream_rpc_method_handler(
        watch,
        request_deserializer=cpb.ClusterHealthServiceWatchRequest.FromString,
        response_serializer=cpb.ClusterHealthServiceWatchResponse.SerializeToString,
    )
    service = "capwatch.v1.ClusterHealthService"
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service, {"Watch": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with ClusterHealthClient(target=f"127.0.0.1:{port}", backoff=TINY) as client:
            events = client.events()
            assert isinstance(await anext(events), Disconnected)
            snapshot = await next_of(events, ClusterSnapshot)
            assert [n.node_name for n in snapshot.snapshot.nodes] == ["new"]
            assert snapshot.pages == ()
            await events.aclose()
    finally:
        await server.stop(0)


async def test_get_cluster_snapshot_follows_every_page(rig: ClusterRig):
    """snapshot() asks page after page (here two nodes each) and joins them in order."""
    for name in ("gpu-c", "gpu-d", "gpu-e"):
        rig.set(name)
    async with ClusterHealthClient(target=rig.target) as client:
        now = await client.snapshot(page_size=2)
    assert [n.node_name for n in now.nodes] == ["gpu-a", "gpu-b", "gpu-c", "gpu-d", "gpu-e"]
    assert now.controller_instance_id == rig.view.instance_id
