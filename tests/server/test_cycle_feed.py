"""The Watch stream's shared cycles (server/grpc/cycle_feed.py): one message, honest ages.

The servicer's Watch is driven directly, on a fake clock, so time can stand
still between two sends or jump between them: what a stream sends at a given
instant is then exact. (Over a real channel the tests in test_watch.py hold
the stream's order, fields and resume semantics.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from capwatch.agent.devices import inventory
from capwatch.agent.hub import Hub
from capwatch.agent.reports import CycleReport, GpuResult
from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.kit.clock import FakeClock
from capwatch.server.grpc import mapping
from capwatch.server.grpc.cycle_feed import AGE_WINDOW_S, CycleFeed
from capwatch.server.grpc.node_health import NodeHealthServicer
from capwatch.server.grpc.nodes import OneNode
from capwatch.server.grpc.publication import Publication
from tests.server.harness import NODE, UUIDS, failed, ok, settings_for

pytestmark = pytest.mark.asyncio

INTERVAL_S = 1.0
STALE_AFTER_S = 3 * INTERVAL_S
QUIET = 60.0  # heartbeat period: none within a test


class FakeContext:
    """What Watch uses of a grpc.aio.ServicerContext."""

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise AssertionError(f"aborted: {code} {details}")

    def peer(self) -> str:
        return "ipv4:127.0.0.1:40000"


class Agent:
    """A hub on a fake clock, its publication, and the capwatch.v1 servicer over them."""

    def __init__(self, *, capacity: int = 16) -> None:
        self.clock = FakeClock()
        self.hub = Hub(
            clock=self.clock,
            stale_after_s=STALE_AFTER_S,
            capacity=capacity,
            devices=inventory(dict(enumerate(UUIDS)), wall=self.clock.wall()),
        )
        self.publication = Publication(
            hub=self.hub,
            clock=self.clock,
            node_name=NODE,
            interval_s=INTERVAL_S,
            namer=settings_for().device_namer(),
            pool_name=NODE,
            max_subscribers=100,
        )
        self.servicer = NodeHealthServicer(OneNode(self.publication))
        self.sequence = 0
        self._feed: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Agent:
        self._feed = asyncio.create_task(self.servicer.feed(), name="test-watch-feed")
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.hub.release_readers()
        assert self._feed is not None
        async with asyncio.timeout(2):
            await self._feed

    def publish(self, gpus: tuple[GpuResult, ...] = (ok(0), ok(1), ok(2))) -> CycleReport:
        self.sequence += 1
        wall, mono = self.clock.wall(), self.clock.monotonic()
        report = CycleReport(
            sequence=self.sequence,
            started_wall=wall - 0.25,
            finished_wall=wall,
            started_monotonic=mono - 0.25,
            finished_monotonic=mono,
            gpus=gpus,
        )
        self.hub.publish(report)
        return report

    def watch(self, **request: Any) -> AsyncIterator[bytes]:
        watch_request = pb.WatchRequest(**request)
        watch_request.heartbeat_interval.FromSeconds(int(QUIET))
        stream: AsyncIterator[bytes] = self.servicer.Watch(watch_request, FakeContext())  # type: ignore[arg-type]
        return stream

    def expected(self, report: CycleReport, *, as_of: float) -> bytes:
        """The reference mapper's message for ``report`` with readiness as of ``as_of``."""
        state = self.hub.state()
        devices = dict(self.hub.history(report.sequence - 1)[0][1])
        return pb.WatchResponse(
            cycle=mapping.cycle(
                report,
                devices=devices,
                namer=self.publication.namer,
                ready=self.hub.readiness(state, now=as_of),
                age_s=as_of - report.finished_monotonic,
            )
        ).SerializeToString()


async def take(stream: AsyncIterator[bytes]) -> bytes:
    async with asyncio.timeout(2):
        return await anext(stream)


async def test_every_unfiltered_stream_sends_one_shared_message_within_a_window() -> None:
    """Two streams, one cycle, the clock standing still: the same bytes object for both,
    the reference mapper's message with its ages as of the window's end."""
    async with Agent() as agent:
        first, second = agent.watch(), agent.watch()
        await take(first), await take(second)  # snapshots
        report = agent.publish()
        sent = await take(first)
        agent.clock.advance(AGE_WINDOW_S / 2)  # still inside the window
        assert await take(second) is sent
        assert sent == agent.expected(report, as_of=report.finished_monotonic + AGE_WINDOW_S)
        await first.aclose()
        await second.aclose()


async def test_a_cycle_sent_late_reports_its_age_at_sending_never_younger() -> None:
    """A resumed batch sent while time passes: each cycle's ages are those of its own send
    (at most the window older), not those of the moment the batch began."""
    async with Agent() as agent:
        reports = [agent.publish() for _ in range(3)]
        resumed = agent.watch(since_sequence=1, agent_instance_id=agent.hub.instance_id)
        for report in reports[1:]:
            agent.clock.advance(5.0)  # a slow client: the next send comes 5 s later
            now = agent.clock.monotonic()
            cycle = pb.WatchResponse.FromString(await take(resumed)).cycle
            assert cycle.sequence == report.sequence
            age = cycle.readiness.last_cycle_age.ToTimedelta().total_seconds()
            good = cycle.readiness.last_good_cycle_age.ToTimedelta().total_seconds()
            true_age = now - report.finished_monotonic
            assert true_age <= age <= true_age + AGE_WINDOW_S
            true_good = now - reports[-1].finished_monotonic
            assert true_good <= good <= true_good + AGE_WINDOW_S
        await resumed.aclose()


async def test_a_verdict_that_changes_within_a_cycle_re_encodes_its_devices() -> None:
    """A cycle sent after the agent went stale carries the stale verdict, and with it
    devices of unknown health: the message of that moment, byte for byte."""
    async with Agent() as agent:
        agent.publish()
        stream = agent.watch()
        await take(stream)
        report = agent.publish((ok(0), failed(1), ok(2)))
        fresh = pb.WatchResponse.FromString(await take(stream)).cycle
        assert fresh.readiness.reason == pb.READINESS_REASON_CYCLE_FAILED
        assert [d.health for d in fresh.devices][:2] == [
            pb.DEVICE_HEALTH_HEALTHY,
            pb.DEVICE_HEALTH_UNHEALTHY,
        ]

        agent.clock.advance(STALE_AFTER_S + 1)
        late = agent.watch(since_sequence=report.sequence - 1)
        resumed = await take(late)
        assert resumed == agent.expected(report, as_of=agent.clock.monotonic() + AGE_WINDOW_S)
        cycle = pb.WatchResponse.FromString(resumed).cycle
        assert cycle.readiness.reason == pb.READINESS_REASON_STALE
        assert {d.health for d in cycle.devices} == {pb.DEVICE_HEALTH_UNKNOWN}
        await stream.aclose()
        await late.aclose()


async def test_a_filtered_stream_encodes_its_own_devices_as_of_sending() -> None:
    """A device filter narrows the shared cycle; its ages are exact at send time."""
    async with Agent() as agent:
        stream = agent.watch(filter=pb.DeviceFilter(indexes=[1]))
        await take(stream)
        report = agent.publish()
        agent.clock.advance(0.5)
        cycle = pb.WatchResponse.FromString(await take(stream)).cycle
        assert [d.index for d in cycle.devices] == [1]
        assert cycle.readiness.last_cycle_age.ToTimedelta().total_seconds() == pytest.approx(
            agent.clock.monotonic() - report.finished_monotonic
        )
        await stream.aclose()


async def test_the_feed_publishes_what_the_hub_still_holds_after_falling_behind() -> None:
    """Ten cycles into a ring of four before the feed runs: it takes the four, and a stream
    that was at cycle 2 resyncs rather than skipping cycles."""
    agent = Agent(capacity=4)
    feed = CycleFeed(agent.publication)
    for _ in range(2):
        agent.publish()
    feed.catch_up()
    assert (feed.broadcast.first, feed.broadcast.sequence) == (1, 2)
    for _ in range(8):
        agent.publish()
    feed.catch_up()
    assert (feed.broadcast.first, feed.broadcast.sequence) == (7, 10)
    assert not feed.broadcast.holds_after(2)
    assert [feed.broadcast.get(n).report.sequence for n in range(7, 11)] == [7, 8, 9, 10]  # type: ignore[union-attr]


async def test_the_feed_closes_the_broadcast_however_it_ends() -> None:
    """Released readers (server stop) end the feed; so does a cancellation. Either way the
    broadcast closes, so no stream is left waiting on it."""
    agent = Agent()
    feed = CycleFeed(agent.publication)
    running = asyncio.create_task(feed.run())
    await asyncio.sleep(0)
    agent.publish()
    async with asyncio.timeout(2):
        while feed.broadcast.sequence < 1:  # noqa: ASYNC110 - the feed runs on this loop
            await asyncio.sleep(0)
    agent.hub.release_readers()
    async with asyncio.timeout(2):
        await running
    assert feed.broadcast.closed

    cancelled = CycleFeed(Agent().publication)
    task = asyncio.create_task(cancelled.run())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled.broadcast.closed
