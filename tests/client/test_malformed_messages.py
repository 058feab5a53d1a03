"""Messages that parse but make no sense (client/retrying.py, client/node_health.py,
client/cluster_health.py): a Duration no timedelta holds, or a negative one, drops the
stream like any failure. The client yields Disconnected (``malformed``), logs one
throttled line, waits its backoff and calls again; nothing is raised out of the
iteration. Over a real gRPC server on port 0 that sends what each test scripts, and the
real clients."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncGenerator, Callable
from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration

from capwatch.api.gen.capwatch.v1 import cluster_health_pb2 as cpb
from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.client import retrying
from capwatch.client.cluster_health import ClusterHealthClient
from capwatch.client.node_health import Backoff, Disconnected, Event, NodeHealthClient, Snapshot
from capwatch.kit.throttling import ThrottledLog
from tests.client.support import Script, scripted

pytestmark = pytest.mark.asyncio

TINY = Backoff(initial_s=0.001, max_s=0.004, multiplier=2)
HUGE = Duration(seconds=2**62)  # past what a timedelta holds: ToTimedelta() overflows


def good_snapshot() -> pb.NodeSnapshot:
    return pb.NodeSnapshot(
        node_name="gpu-1",
        agent_instance_id="agent-1",
        sequence=3,
        interval=Duration(seconds=15),
        stale_after=Duration(seconds=45),
        readiness=pb.Readiness(ready=True, last_cycle_age=Duration(seconds=2)),
    )


def with_bad_interval() -> list[bytes]:
    snapshot = good_snapshot()
    snapshot.interval.CopyFrom(HUGE)
    return [pb.WatchResponse(snapshot=snapshot).SerializeToString()]


def with_bad_stale_after() -> list[bytes]:
    snapshot = good_snapshot()
    snapshot.stale_after.CopyFrom(Duration(seconds=-45))
    return [pb.WatchResponse(snapshot=snapshot).SerializeToString()]


def with_bad_age() -> list[bytes]:
    snapshot = good_snapshot()
    snapshot.readiness.last_cycle_age.CopyFrom(Duration(seconds=1, nanos=-5))
    return [pb.WatchResponse(snapshot=snapshot).SerializeToString()]


def with_bad_cycle() -> list[bytes]:
    """A good snapshot, then a cycle whose duration is no Duration."""
    cycle = pb.CycleReport(sequence=4, duration=HUGE)
    return [
        pb.WatchResponse(snapshot=good_snapshot()).SerializeToString(),
        pb.WatchResponse(cycle=cycle).SerializeToString(),
    ]


def with_bad_heartbeat() -> list[bytes]:
    heartbeat = pb.Heartbeat(readiness=pb.Readiness(last_good_cycle_age=HUGE))
    return [
        pb.WatchResponse(snapshot=good_snapshot()).SerializeToString(),
        pb.WatchResponse(heartbeat=heartbeat).SerializeToString(),
    ]


async def disconnects(events: AsyncGenerator[Any, None], count: int) -> list[Disconnected]:
    found = []
    async with asyncio.timeout(10):
        async for event in events:
            if isinstance(event, Disconnected):
                found.append(event)
                if len(found) == count:
                    return found
    raise AssertionError("stream ended")


@pytest.mark.parametrize(
    ("messages", "field"),
    [
        (with_bad_interval, "snapshot.interval is not a valid Duration"),
        (with_bad_stale_after, "snapshot.stale_after must be between 0s and"),
        (with_bad_age, "snapshot.readiness.last_cycle_age is not a valid Duration"),
        (with_bad_cycle, "cycle.duration is not a valid Duration"),
        (with_bad_heartbeat, "heartbeat.readiness.last_good_cycle_age is not a valid Duration"),
    ],
    ids=["interval", "stale-after", "age", "cycle", "heartbeat"],
)
async def test_a_malformed_message_is_a_failure_retried_with_backoff(
    messages: Callable[[], list[bytes]],
    field: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An agent whose every stream carries a Duration out of range (2**62 s, negative,
    nanos of the wrong sign): each stream is dropped with a Disconnected saying which
    field, malformed, code None; the waits grow by the backoff (good messages before the
    bad one reset nothing); the iteration goes on, and the log has a throttled warning,
    no traceback. (Before: OverflowError out of events(), and a restart every second.)"""
    caplog.set_level(logging.INFO, logger="capwatch.client.retrying")
    # The throttle is the process's: a fresh one, so earlier tests have not spent it.
    monkeypatch.setattr(retrying, "_malformed_log", ThrottledLog(retrying.log))
    script = Script(messages)
    async with scripted("capwatch.v1.NodeHealthService", "Watch", script) as target:
        client = NodeHealthClient(target=target, backoff=TINY, rng=random.Random(7))
        async with client, contextlib.aclosing(client.events()) as events:
            lost = await disconnects(events, 5)
    expected_rng = random.Random(7)
    expected = [expected_rng.uniform(0, c) for c in (0.001, 0.002, 0.004, 0.004, 0.004)]
    assert [e.attempt for e in lost] == [0, 1, 2, 3, 4]
    assert [e.retry_in for e in lost] == expected
    assert all(e.malformed and e.code is None for e in lost)
    assert all(e.error.startswith("malformed message from the agent: ") for e in lost)
    assert all(field in e.error for e in lost), lost[0].error
    assert script.calls >= 5
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert 1 <= len(warnings) <= 5
    assert warnings[0].getMessage().startswith(f"stream dropped target={target}: malformed")
    assert all(r.exc_info is None for r in caplog.records)


async def test_the_agent_sending_sense_again_is_followed_again() -> None:
    """Once the agent's snapshot is well formed, the client follows it as usual: a
    Snapshot event, with the interval it says."""
    bad = [True]

    def messages() -> list[bytes]:
        if bad:
            bad.clear()
            return with_bad_interval()
        return [pb.WatchResponse(snapshot=good_snapshot()).SerializeToString()]

    script = Script(messages)
    async with scripted("capwatch.v1.NodeHealthService", "Watch", script) as target:
        client = NodeHealthClient(target=target, backoff=TINY)
        async with client, contextlib.aclosing(client.events()) as events:
            seen: list[Event] = []
            async with asyncio.timeout(10):
                async for event in events:
                    seen.append(event)
                    if isinstance(event, Snapshot):
                        break
    assert [type(e) for e in seen] == [Disconnected, Snapshot]
    assert isinstance(seen[0], Disconnected)
    assert seen[0].malformed


async def test_a_malformed_node_from_the_controller_is_retried_too() -> None:
    """The cluster client reads a node's last_cycle_age the same way: 2**62 s drops the
    stream (malformed), and it is retried with backoff."""

    def messages() -> list[bytes]:
        node = cpb.NodeHealth(node_name="gpu-1", last_cycle_age=HUGE)
        snapshot = cpb.ClusterSnapshot(controller_instance_id="c-1", nodes=[node])
        return [cpb.ClusterHealthServiceWatchResponse(snapshot=snapshot).SerializeToString()]

    script = Script(messages)
    async with scripted("capwatch.v1.ClusterHealthService", "Watch", script) as target:
        client = ClusterHealthClient(target=target, backoff=TINY)
        async with client, contextlib.aclosing(client.events()) as events:
            lost = await disconnects(events, 3)
    assert [e.attempt for e in lost] == [0, 1, 2]
    assert all(e.malformed for e in lost)
    assert "snapshot.nodes.last_cycle_age is not a valid Duration" in lost[0].error
