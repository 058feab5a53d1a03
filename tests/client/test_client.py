"""NodeHealthClient against a real agent server: order, resume, resync, backoff, close."""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import AsyncGenerator, Iterator

import grpc
import pytest

from capwatch.client.node_health import (
    Backoff,
    ClientError,
    Cycle,
    DeviceList,
    Disconnected,
    DraVersion,
    Event,
    Heartbeat,
    NodeHealthClient,
    Snapshot,
)
from capwatch.kit.clock import FakeClock
from capwatch.kit.errors import ConfigError
from tests.client.support import eventually
from tests.server.harness import (
    UUIDS,
    ServerHarness,
    failed,
    ok,
    restart_harness,
    settings_for,
    start_harness,
)

pytestmark = pytest.mark.asyncio

TINY = Backoff(initial_s=0.001, max_s=0.004, multiplier=2)


async def next_of(events: AsyncGenerator[Event, None], *kinds: type) -> Event:
    """The next event of one of ``kinds``, skipping others (within 3 s)."""
    async with asyncio.timeout(3):
        async for event in events:
            if isinstance(event, kinds):
                return event
    raise AssertionError("stream ended")


async def subscribers_drop_to_zero(harness: ServerHarness) -> None:
    await eventually(lambda: harness.publication.subscribers == 0)


@pytest.fixture
def closed_port() -> Iterator[str]:
    """A port bound but not listening: every connection is refused, and nobody else gets it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def short_dir(tmp_path_factory: pytest.TempPathFactory):
    """A directory with a short path: a unix socket path must fit in 108 bytes."""
    return tmp_path_factory.mktemp("cw", numbered=True)


class TopOfRange(random.Random):
    """A 'random' source that always picks the longest allowed wait."""

    def uniform(self, a: float, b: float) -> float:
        return b


async def test_events_in_order(harness: ServerHarness):
    """Snapshot (not a resync), cycles 1 and 2 in order, then a heartbeat naming cycle 2."""
    async with NodeHealthClient(target=harness.target, heartbeat_interval=1) as client:
        events = client.events()
        first = await anext(events)
        assert isinstance(first, Snapshot)
        assert (first.resync, first.restarted) == (False, False)
        assert first.snapshot.node_name == "node-under-test"
        assert first.snapshot.sequence == 0
        assert [d.index for d in first.snapshot.devices] == [0, 1, 2]
        harness.publish()
        harness.publish([failed(0)])
        cycles = [await next_of(events, Cycle, Snapshot) for _ in range(2)]
        assert [type(e) for e in cycles] == [Cycle, Cycle]
        assert [e.cycle.sequence for e in cycles] == [1, 2]
        assert not cycles[1].cycle.enforced
        beat = await next_of(events, Heartbeat)
        assert isinstance(beat, Heartbeat)
        assert beat.heartbeat.last_sequence == 2
        assert first.received_at <= cycles[0].received_at <= beat.received_at
        assert client.position.sequence == 2
        assert client.position.instance_id == harness.hub.instance_id
        await events.aclose()


async def test_device_filter_limits_every_message(harness: ServerHarness):
    """Indexes and UUIDs select GPUs in the snapshot and in each cycle."""
    async with NodeHealthClient(
        target=harness.target, indexes=[1], uuids=[UUIDS[2].lower()]
    ) as client:
        events = client.events()
        first = await anext(events)
        assert isinstance(first, Snapshot)
        assert [d.index for d in first.snapshot.devices] == [1, 2]
        harness.publish()
        cycle = await next_of(events, Cycle)
        assert isinstance(cycle, Cycle)
        assert [d.index for d in cycle.cycle.devices] == [1, 2]
        await events.aclose()


async def test_readiness_age_adds_time_since_receipt(harness: ServerHarness):
    """last_readiness ages what the agent reported by the client's own time since receipt."""
    harness.publish()
    clock = FakeClock(monotonic=50.0)
    async with NodeHealthClient(target=harness.target, clock=clock) as client:
        assert client.last_readiness is None
        events = client.events()
        first = await anext(events)
        assert first.received_at == 50.0
        observed = client.last_readiness
        assert observed is not None
        assert observed.readiness.ready
        reported = observed.readiness.last_good_cycle_age.ToTimedelta().total_seconds()
        assert observed.last_good_cycle_age(now=57.5) == pytest.approx(reported + 7.5)
        assert observed.last_cycle_age(now=50.0) == pytest.approx(reported, abs=0.01)
        await events.aclose()


async def test_unary_snapshot_fails_then_recovers_at_once(
    harness: ServerHarness, servers: list[ServerHarness]
):
    """snapshot() returns the state; while the agent is down it raises ClientError(UNAVAILABLE),
    and the first call after it is back succeeds (no grpc reconnect backoff in the way)."""
    harness.publish()
    async with NodeHealthClient(target=harness.target) as client:
        snapshot = await client.snapshot()
        assert snapshot.sequence == 1
        assert len(snapshot.devices) == 3
        await harness.server.stop()
        with pytest.raises(ClientError) as exc:
            await client.snapshot(deadline_s=2)
        assert exc.value.code is grpc.StatusCode.UNAVAILABLE
        assert str(exc.value).startswith(f"GetSnapshot from {harness.target}: UNAVAILABLE")
        servers.append(await restart_harness(harness, same_instance=True))
        assert (await client.snapshot(deadline_s=2)).sequence == 1


async def test_resume_after_restart_gets_exactly_the_missed_cycles(
    harness: ServerHarness, servers: list[ServerHarness]
):
    """Same agent instance after a server restart: the missed cycles, no snapshot, no repeats.
    The first attempt after the server is back gets them: grpc's own reconnect backoff
    (1 s and up, left by the refused attempts) does not hold the client back."""
    harness.publish()
    async with NodeHealthClient(target=harness.target, backoff=TINY) as client:
        events = client.events()
        assert isinstance(await anext(events), Snapshot)
        harness.publish()
        assert (await next_of(events, Cycle)).cycle.sequence == 2

        await harness.server.stop()
        lost = [await next_of(events, Disconnected) for _ in range(3)]
        assert [e.attempt for e in lost] == [0, 1, 2]
        codes = [e.code for e in lost]
        # The agent ended the stream on shutdown, then refused connections.
        assert codes == [grpc.StatusCode.OK, *[grpc.StatusCode.UNAVAILABLE] * 2]
        restarted = await restart_harness(harness, same_instance=True)
        servers.append(restarted)
        restarted.publish()
        restarted.publish()

        # The generator is paused at the last Disconnected: its next attempt is the first
        # since the server came back, and it must succeed. Had it shared a subchannel
        # still sitting out grpc's reconnect backoff after the refusals, that attempt
        # would fail at once (UNAVAILABLE) and a Disconnected would come first: this
        # is told by the order of events, not by how long they took.
        seen = [await next_of(events, Cycle, Snapshot, Disconnected) for _ in range(2)]
        assert [type(e) for e in seen] == [Cycle, Cycle]
        assert [e.cycle.sequence for e in seen] == [3, 4]
        restarted.publish()
        assert (await next_of(events, Cycle, Snapshot)).cycle.sequence == 5
        await restarted.server.stop()
        again = await next_of(events, Disconnected)
        assert again.attempt == 0  # reset by the messages since
        await events.aclose()


async def test_new_agent_instance_answers_with_resync_snapshot(
    harness: ServerHarness, servers: list[ServerHarness]
):
    """A restarted agent (new instance) cannot replay; the client gets a resync snapshot."""
    harness.publish()
    async with NodeHealthClient(target=harness.target, backoff=TINY) as client:
        events = client.events()
        assert isinstance(await anext(events), Snapshot)
        harness.publish()
        assert (await next_of(events, Cycle)).cycle.sequence == 2
        fresh = await restart_harness(harness, same_instance=False)
        servers.append(fresh)
        for _ in range(3):  # past the client's position: only the instance id tells them apart
            fresh.publish()
        assert isinstance(await next_of(events, Disconnected), Disconnected)
        resync = await next_of(events, Snapshot, Cycle)
        assert isinstance(resync, Snapshot)
        assert (resync.resync, resync.restarted) == (True, True)
        assert resync.snapshot.agent_instance_id == fresh.hub.instance_id
        assert resync.snapshot.sequence == 3
        fresh.publish()
        assert (await next_of(events, Cycle)).cycle.sequence == 4
        assert client.position.instance_id == fresh.hub.instance_id
        await events.aclose()


async def test_since_resumes_without_a_snapshot(harness: ServerHarness):
    """events(since=N) starts with cycle N+1, not with a snapshot."""
    for _ in range(3):
        harness.publish()
    async with NodeHealthClient(target=harness.target) as client:
        events = client.events(since=1)
        seen = [await anext(events), await anext(events)]
        assert [type(e) for e in seen] == [Cycle, Cycle]
        assert [e.cycle.sequence for e in seen] == [2, 3]
        await events.aclose()


async def test_backoff_grows_is_capped_and_jittered(closed_port: str):
    """Each refused attempt waits uniform(0, min(max, initial*2**n)) from the given Random."""
    async with NodeHealthClient(target=closed_port, backoff=TINY, rng=random.Random(7)) as client:
        events = client.events()
        lost = [await next_of(events, Disconnected) for _ in range(6)]
        await events.aclose()
    expected_rng = random.Random(7)
    ceilings = [0.001, 0.002, 0.004, 0.004, 0.004, 0.004]
    expected = [expected_rng.uniform(0, ceiling) for ceiling in ceilings]
    assert [e.attempt for e in lost] == [0, 1, 2, 3, 4, 5]
    assert [e.retry_in for e in lost] == expected
    assert len(set(expected)) == 6  # jittered: no two waits alike
    assert {e.code for e in lost} == {grpc.StatusCode.UNAVAILABLE}


async def test_a_unix_socket_target_retries_at_least_once_a_second(short_dir):
    """On a unix socket (the agent on this machine) the longest wait between attempts
    is 1 s, where a network target's grows to 10 s."""
    async with NodeHealthClient(
        target=f"unix://{short_dir}/absent.sock", rng=TopOfRange()
    ) as client:
        events = client.events()
        lost = [await next_of(events, Disconnected) for _ in range(5)]
        await events.aclose()
    assert [e.retry_in for e in lost] == [0.2, 0.4, 0.8, 1.0, 1.0]
    assert NodeHealthClient(target="127.0.0.1:1").reconnect_backoff == Backoff()


async def test_a_unix_socket_target_retries_once_an_interval_when_that_is_shorter(
    servers: list[ServerHarness], short_dir
):
    """Once the agent's snapshot has said its interval (0.5 s here), the waits on a
    unix socket are capped at that interval."""
    target = f"unix://{short_dir}/agent.sock"
    local = await start_harness(settings=settings_for(target), interval_s=0.5)
    servers.append(local)
    async with NodeHealthClient(target=target, rng=TopOfRange()) as client:
        events = client.events()
        assert isinstance(await anext(events), Snapshot)
        await local.server.stop()
        lost = [await next_of(events, Disconnected) for _ in range(4)]
        await events.aclose()
    assert [e.retry_in for e in lost] == [0.2, 0.4, 0.5, 0.5]


async def test_silent_stream_is_presumed_dead_and_resumed(harness: ServerHarness):
    """No message within silence_timeout: Disconnected (code None), then a resume, no snapshot."""
    harness.publish()
    async with NodeHealthClient(
        target=harness.target, heartbeat_interval=5, silence_timeout=0.2, backoff=TINY
    ) as client:
        events = client.events()
        assert isinstance(await anext(events), Snapshot)
        lost = await anext(events)
        assert isinstance(lost, Disconnected)
        assert lost.code is None
        assert "no message for 0.2s" in lost.error
        harness.publish()
        resumed = await next_of(events, Cycle, Snapshot)
        assert isinstance(resumed, Cycle)
        assert resumed.cycle.sequence == 2
        await events.aclose()


async def test_close_ends_iteration_promptly(harness: ServerHarness, closed_port: str):
    """close() ends a quiet stream and a long backoff wait at once, and frees the server slot."""
    client = NodeHealthClient(target=harness.target)
    received: list[Event] = []

    async def consume(c: NodeHealthClient) -> None:
        async for event in c.events():
            received.append(event)

    task = asyncio.create_task(consume(client))
    await eventually(lambda: received)
    await client.close()
    # Hang guards, not speed claims: without close() the quiet stream would go on for
    # ever (heartbeats keep it alive), and the backoff wait below lasts a minute.
    async with asyncio.timeout(5):
        await task
    await subscribers_drop_to_zero(harness)

    waiting = NodeHealthClient(
        target=closed_port, backoff=Backoff(initial_s=60, max_s=60), rng=TopOfRange()
    )
    events = waiting.events()
    lost = await anext(events)
    assert isinstance(lost, Disconnected)
    assert lost.retry_in == 60
    pending = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0.05)
    await waiting.close()
    async with asyncio.timeout(5):
        with pytest.raises(StopAsyncIteration):
            await pending


async def test_leaving_the_loop_cancels_the_stream(harness: ServerHarness):
    """Closing the event generator (break under aclosing) ends the server-side stream."""
    harness.publish()
    async with NodeHealthClient(target=harness.target) as client:
        events = client.events()
        await anext(events)
        assert harness.publication.subscribers == 1
        with pytest.raises(ClientError, match="already streaming"):
            client.events()
        await events.aclose()
        await subscribers_drop_to_zero(harness)
        again = client.events(since=client.position.sequence)  # one at a time is fine
        assert isinstance(await anext(again), Heartbeat)
        await again.aclose()


async def test_dra_devices_yields_each_full_list(harness: ServerHarness):
    """dra_devices() yields the kubelet's full device list on open and after each cycle."""
    async with NodeHealthClient(target=harness.target) as client:
        events = client.dra_devices(DraVersion.V1)
        first = await anext(events)
        assert isinstance(first, DeviceList)
        assert [d.device.device_name for d in first.response.devices] == [
            "gpu-0",
            "gpu-1",
            "gpu-2",
        ]
        harness.publish([ok(0), failed(1), ok(2)])
        after = await anext(events)
        assert isinstance(after, DeviceList)
        assert [d.health for d in after.response.devices] == [1, 2, 1]
        await events.aclose()


async def test_cancelling_the_consumer_ends_the_stream(harness: ServerHarness):
    """Cancelling the task that iterates ends the server-side stream too (no leaked call)."""
    async with NodeHealthClient(target=harness.target) as client:

        async def consume() -> None:
            async for _ in client.events():
                pass

        task = asyncio.create_task(consume())
        await eventually(lambda: harness.publication.subscribers == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await subscribers_drop_to_zero(harness)


async def test_unix_socket_target(servers: list[ServerHarness], tmp_path):
    """The agent's unix socket (the on-node default) works as a target like host:port does."""
    socket_path = tmp_path / "agent.sock"
    local = await start_harness(settings=settings_for(f"unix://{socket_path}"))
    servers.append(local)
    assert local.server.addresses == [f"unix://{socket_path}"]
    async with NodeHealthClient(target=f"unix://{socket_path}") as client:
        events = client.events()
        first = await anext(events)
        assert isinstance(first, Snapshot)
        assert first.snapshot.node_name == "node-under-test"
        await events.aclose()


@pytest.mark.parametrize("heartbeat_s", [0.5, 3601.0])
async def test_heartbeats_the_agent_would_refuse_are_refused_before_connecting(
    heartbeat_s: float,
) -> None:
    """The client library holds heartbeats to the agent's own limits (1 s to 1 h): a value
    the agent answers with INVALID_ARGUMENT is a configuration error here, at once."""
    with pytest.raises(ConfigError, match=r"heartbeat_interval: must be between 1\.0s and 3600s"):
        NodeHealthClient(target="127.0.0.1:1", heartbeat_interval=heartbeat_s)
