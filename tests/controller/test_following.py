"""Stream followers (controller/following.py): one supervised stream per agent target,
replaced when the agent moves, stopped when it goes, restarted when it ends by itself.

The clients are fakes with the two NodeHealthClient methods a follower uses (``events()``
and ``close()``); time is the virtual loop's and the backoff's jitter a chosen source, so
the restart delays are exact."""

from __future__ import annotations

import asyncio
import logging
import math
import random

import pytest

from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.client.node_health import Backoff, NodeHealthClient
from capwatch.controller import following
from capwatch.controller.conditions import ConditionReason
from capwatch.controller.following import Followers
from capwatch.controller.tracking import NodeTracker
from capwatch.kit.clock import SystemClock
from capwatch.kit.pacing import TokenBucket
from tests.client.support import Script, scripted
from tests.controller.builders import heartbeat_event, report, snapshot, snapshot_event
from tests.controller.fakes import FakeClients, FakeStream, RecordingListener
from tests.controller.virtual_time import LoopClock

A, B = "10.0.0.1:50051", "10.0.0.2:50051"
FIRST_S = following.RESTART_BACKOFF.initial_s  # the longest first restart delay


class TopOfRange(random.Random):
    """A 'random' source that always picks the longest allowed wait."""

    def uniform(self, a: float, b: float) -> float:
        return b


class Rig:
    """Followers with a real tracker, told about targets as the shard sink tells both;
    every restart waits the longest its backoff allows."""

    def __init__(self, *, dial_rate: float | None = None) -> None:
        self.clock = LoopClock()
        self.listener = RecordingListener()
        self.tracker = NodeTracker(clock=self.clock, listeners=[self.listener])
        self.clients = FakeClients()
        dials = None
        if dial_rate is not None:
            dials = TokenBucket(rate=dial_rate, burst=math.ceil(dial_rate), clock=self.clock)
        self.followers = Followers(
            tracker=self.tracker, clients=self.clients, rng=TopOfRange(), dials=dials
        )

    def target(self, node: str, address: str | None) -> None:
        self.tracker.target(node, address)
        self.followers.target(node, address)

    async def close(self) -> None:
        await self.followers.close()
        self.tracker.close()


async def settle() -> None:
    """Let every ready task run (no time passes)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def opened(rig: Rig, node: str) -> FakeStream:
    """The stream the follower of ``node`` opened (the client is made in its task)."""
    await settle()
    stream = rig.clients.latest(node)
    assert stream.opened
    return stream


@pytest.mark.asyncio
async def test_each_target_gets_a_stream_whose_events_reach_the_tracker() -> None:
    """A target starts one client for (node, address); what its stream says is applied to
    the tracker for that node."""
    rig = Rig()
    rig.target("gpu-1", A)
    rig.target("gpu-2", B)
    await settle()
    assert [(s.node, s.address) for s in rig.clients.made] == [("gpu-1", A), ("gpu-2", B)]
    assert len(rig.followers) == 2
    stream = rig.clients.latest("gpu-1")
    stream.put(snapshot_event(snapshot("gpu-1", last_cycle=report(1)), at=rig.clock.monotonic()))
    await settle()
    state = rig.tracker.get("gpu-1")
    assert state is not None
    assert state.condition.reason is ConditionReason.CAPS_ENFORCED
    other = rig.tracker.get("gpu-2")
    assert other is not None
    assert other.condition.reason is ConditionReason.AGENT_STARTING
    await rig.close()


@pytest.mark.asyncio
async def test_dials_are_paced_at_the_dial_rate() -> None:
    """1,000 targets at once with a dial rate of 100 a second: a second's worth (100)
    dial at once, then 100 each second, so the last dials 9 s in, never more than the
    rate in any second after the first; a target dropped while it waits for its turn
    never dials."""
    rig = Rig(dial_rate=100)
    start = rig.clock.monotonic()
    for i in range(1000):
        rig.target(f"gpu-{i:04}", A)
    rig.target("gpu-0999", None)
    await settle()
    made_at: list[float] = [0.0] * len(rig.clients.made)
    for _ in range(30):
        before = len(rig.clients.made)
        await asyncio.sleep(0.5)
        made_at += [rig.clock.monotonic() - start] * (len(rig.clients.made) - before)
    assert len(rig.clients.made) == 999
    assert "gpu-0999" not in {s.node for s in rig.clients.made}
    assert made_at.count(0.0) == 100
    assert max(made_at) == pytest.approx(9.0, abs=0.5)
    for second in range(1, 10):
        assert sum(1 for t in made_at if second - 1 < t <= second) <= 100
    await rig.close()


@pytest.mark.asyncio
async def test_the_same_address_again_keeps_the_stream() -> None:
    """Discovery repeating a target does not reconnect it."""
    rig = Rig()
    rig.target("gpu-1", A)
    await settle()
    rig.target("gpu-1", A)
    await settle()
    assert len(rig.clients.made) == 1
    assert not rig.clients.latest("gpu-1").closed
    await rig.close()


@pytest.mark.asyncio
async def test_a_new_address_replaces_the_stream() -> None:
    """An agent that moved is followed at its new address; the old client is closed."""
    rig = Rig()
    rig.target("gpu-1", A)
    old = await opened(rig, "gpu-1")
    rig.target("gpu-1", B)
    await settle()
    new = rig.clients.latest("gpu-1")
    assert old.closed
    assert (new.address, new.opened, new.closed) == (B, True, False)
    assert len(rig.followers) == 1
    await rig.close()


@pytest.mark.asyncio
async def test_a_removed_target_stops_its_stream() -> None:
    """No address: the stream is stopped and its client closed; nothing is restarted."""
    rig = Rig()
    rig.target("gpu-1", A)
    stream = await opened(rig, "gpu-1")
    rig.target("gpu-1", None)
    await settle()
    assert stream.closed
    assert len(rig.followers) == 0
    await asyncio.sleep(FIRST_S * 10)
    assert len(rig.clients.made) == 1
    await rig.close()


@pytest.mark.parametrize("how", ["ended", "raised"])
@pytest.mark.asyncio
async def test_a_stream_that_ends_by_itself_is_restarted_after_the_delay(
    how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A follower that ends (or raises) is a bug: logged as an error, its client closed,
    and a new one started at the same address after the first backoff delay, not before."""
    rig = Rig()
    rig.target("gpu-1", A)
    stream = await opened(rig, "gpu-1")
    started = rig.clock.monotonic()
    with caplog.at_level(logging.ERROR, logger="capwatch.controller.following"):
        if how == "ended":
            stream.end()
        else:
            stream.fail(RuntimeError("boom"))
        await settle()
    assert stream.closed
    assert "ended unexpectedly" in caplog.text
    assert len(rig.followers) == 0
    await asyncio.sleep(FIRST_S - 0.01)
    assert len(rig.clients.made) == 1
    await asyncio.sleep(0.02)
    await settle()
    again = rig.clients.latest("gpu-1")
    assert again is not stream
    assert (again.address, again.opened) == (A, True)
    assert rig.clock.monotonic() - started == pytest.approx(FIRST_S, abs=0.02)
    assert len(rig.followers) == 1
    # The new stream works.
    again.put(heartbeat_event(at=rig.clock.monotonic()))
    await rig.close()


@pytest.mark.asyncio
async def test_no_restart_where_discovery_no_longer_places_the_agent() -> None:
    """A follower that died is not restarted if its target went, or moved, meanwhile (the
    move started its own stream)."""
    rig = Rig()
    rig.target("gpu-1", A)
    rig.target("gpu-2", A.replace("1:", "3:"))
    await settle()
    rig.clients.latest("gpu-1").end()
    rig.clients.latest("gpu-2").end()
    await settle()
    rig.tracker.target("gpu-1", None)  # discovery dropped it; the follower was gone already
    rig.target("gpu-2", B)
    await asyncio.sleep(FIRST_S * 3)
    await settle()
    assert [s.address for s in rig.clients.of("gpu-1")] == [A]
    assert [s.address for s in rig.clients.of("gpu-2")] == [A.replace("1:", "3:"), B]
    assert len(rig.followers) == 1
    await rig.close()


@pytest.mark.asyncio
async def test_a_client_that_cannot_be_made_is_retried() -> None:
    """A factory that raises (a bad address, say) ends the follower; it is retried."""
    rig = Rig()
    failures = [ValueError("bad target")]

    def flaky(node: str, address: str) -> FakeStream:
        if failures:
            raise failures.pop()
        return rig.clients(node, address)

    rig.followers = Followers(tracker=rig.tracker, clients=flaky, rng=TopOfRange())
    rig.target("gpu-1", A)
    await settle()
    assert rig.clients.made == []
    await asyncio.sleep(FIRST_S + 0.01)
    await settle()
    assert rig.clients.latest("gpu-1").opened
    await rig.close()


@pytest.mark.asyncio
async def test_one_nodes_failure_leaves_the_others_streaming() -> None:
    """A follower ending does not disturb the other nodes' streams."""
    rig = Rig()
    for i in range(5):
        rig.target(f"gpu-{i}", f"10.0.1.{i}:50051")
    await settle()
    rig.clients.latest("gpu-2").fail(RuntimeError("boom"))
    await settle()
    assert [s.closed for s in rig.clients.made] == [False, False, True, False, False]
    assert len(rig.followers) == 4
    await rig.close()


@pytest.mark.asyncio
async def test_close_stops_everything_and_nothing_restarts() -> None:
    """close() cancels every stream and waits for each client to close; a pending restart
    and later targets start nothing."""
    rig = Rig()
    rig.target("gpu-1", A)
    rig.target("gpu-2", B)
    await settle()
    rig.clients.latest("gpu-2").end()
    await settle()
    await rig.followers.close()
    assert all(s.closed for s in rig.clients.made)
    assert len(rig.followers) == 0
    rig.target("gpu-3", "10.0.0.3:50051")
    await asyncio.sleep(FIRST_S * 3)
    assert len(rig.clients.made) == 2
    rig.tracker.close()


@pytest.mark.asyncio
async def test_a_follower_that_keeps_dying_backs_off_and_recovers_its_pace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A follower that dies at once every time (a bug on the agent's first message) is
    restarted after the one backoff, 1 s doubling to a minute, not every second: 5
    restarts in the first 45 s where a fixed 1 s gave 45, one error line each. One that
    ran a minute before dying starts again from 1 s."""
    rig = Rig()
    rig.target("gpu-1", A)
    start = rig.clock.monotonic()
    restarts: list[float] = []
    with caplog.at_level(logging.ERROR, logger="capwatch.controller.following"):
        while rig.clock.monotonic() - start < 45:
            stream = await opened(rig, "gpu-1")
            if stream is not rig.clients.made[0]:
                restarts.append(round(rig.clock.monotonic() - start, 3))
            stream.fail(RuntimeError("boom"))
            await settle()
            while rig.clients.latest("gpu-1") is stream:  # noqa: ASYNC110 (virtual time)
                await asyncio.sleep(0.5)
    assert restarts == [1.0, 3.0, 7.0, 15.0, 31.0]
    assert caplog.text.count("ended unexpectedly; restarting in") == 6
    assert "restarting in 32.0s (failure 6)" in caplog.text

    await asyncio.sleep(32.0)
    survivor = await opened(rig, "gpu-1")
    assert survivor is not stream
    await asyncio.sleep(following.RESTART_BACKOFF.max_s)
    survivor.fail(RuntimeError("boom, a minute later"))
    await settle()
    died = rig.clock.monotonic()
    await asyncio.sleep(FIRST_S + 0.01)
    await settle()
    assert rig.clients.latest("gpu-1") is not survivor
    assert rig.clock.monotonic() - died == pytest.approx(FIRST_S + 0.01, abs=0.02)
    await rig.close()


@pytest.mark.asyncio(loop_factories=["real"])
async def test_an_agent_sending_a_bad_interval_is_a_malformed_node_not_a_restart_loop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A real NodeHealthClient following an agent whose snapshot's interval is 2**62 s (no
    timedelta holds it): the node is Unknown AgentMessageMalformed naming the field, the
    follower never dies (no error line, no traceback: it was 45 tracebacks in 45 s), and
    the client reconnects by its backoff."""
    snapshot = pb.NodeSnapshot(node_name="gpu-1", agent_instance_id="a-1")
    snapshot.interval.seconds = 2**62
    script = Script(lambda: [pb.WatchResponse(snapshot=snapshot).SerializeToString()])
    tracker = NodeTracker(clock=SystemClock())
    tiny = Backoff(initial_s=0.001, max_s=0.004)
    caplog.set_level(logging.INFO)
    async with scripted("capwatch.v1.NodeHealthService", "Watch", script) as target:
        followers = Followers(
            tracker=tracker,
            clients=lambda node, address: NodeHealthClient(
                target=address, node_name=node, backoff=tiny
            ),
        )
        tracker.target("gpu-1", target)
        followers.target("gpu-1", target)
        async with asyncio.timeout(10):
            while script.calls < 5:  # noqa: ASYNC110 (the server counts)
                await asyncio.sleep(0.01)
        state = tracker.get("gpu-1")
        assert state is not None
        assert state.condition.reason is ConditionReason.AGENT_MESSAGE_MALFORMED
        assert "snapshot.interval is not a valid Duration" in state.condition.message
        assert len(followers) == 1
        await followers.close()
    tracker.close()
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert all(r.exc_info is None for r in caplog.records)
