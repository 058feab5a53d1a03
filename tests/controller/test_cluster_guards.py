"""The cluster stream's server against bad and greedy clients (controller/cluster/serving.py),
with the agent's own guards (server/malformed.py, server/admission.py, api/limits.py):
requests that do not parse, heartbeats out of range or too big for a timedelta, and one
client address trying to take every stream slot. A real gRPC server on port 0 and real
clients."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from capwatch.api.gen.capwatch.v1 import cluster_health_pb2 as cpb
from capwatch.api.gen.capwatch.v1 import cluster_health_pb2_grpc as cpb_grpc
from capwatch.controller.cluster.serving import ClusterServer
from capwatch.controller.cluster.state import ClusterView
from capwatch.kit.clock import FakeClock
from capwatch.kit.throttling import THROTTLE_BURST, THROTTLE_REFILL_S

pytestmark = pytest.mark.asyncio(loop_factories=["real"])

GARBAGE = b"\xff\xff\xff\xff"  # a field number of 0 and a truncated varint: never parses
METHODS = {
    "/capwatch.v1.ClusterHealthService/Watch": "unary_stream",
    "/capwatch.v1.ClusterHealthService/GetClusterSnapshot": "unary_unary",
    "/grpc.health.v1.Health/Check": "unary_unary",
    "/grpc.health.v1.Health/Watch": "unary_stream",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": "stream_stream",
}


@contextlib.asynccontextmanager
async def serving(listen: str = "127.0.0.1:0", **limits: Any) -> AsyncIterator[ClusterServer]:
    server = ClusterServer(
        view=ClusterView(clock=FakeClock(monotonic=100.0)),
        listen=listen,
        ready=lambda: True,
        **limits,
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop(grace_s=0.5)


def allowed_lines(elapsed_s: float) -> int:
    """What the throttle may let through in ``elapsed_s``: the burst, plus its refill."""
    return THROTTLE_BURST + 1 + int(elapsed_s / THROTTLE_REFILL_S)


async def call_with_garbage(channel: grpc.aio.Channel, method: str) -> None:
    kind = METHODS[method]
    if kind == "unary_unary":
        await channel.unary_unary(method)(GARBAGE, timeout=10)
    elif kind == "unary_stream":
        await channel.unary_stream(method)(GARBAGE, timeout=10).read()
    else:
        call: Any = channel.stream_stream(method)(timeout=10)
        await call.write(GARBAGE)
        await call.read()


async def send_garbage(channel: grpc.aio.Channel, method: str) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call_with_garbage(channel, method)
    return caught.value


async def test_malformed_requests_get_invalid_argument_and_throttled_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """300 requests that do not parse, over every method of the controller's server (the
    cluster stream, its unary snapshot, health, reflection): each is INVALID_ARGUMENT
    naming the message type, each counted, no stream slot held; the log has at most the
    throttle's lines, none with a traceback, nothing from grpc. (Before: UNKNOWN, and
    grpc.aio's traceback for every one.)"""
    caplog.set_level(logging.DEBUG)
    methods = list(METHODS)
    async with serving() as server:
        started = time.monotonic()
        async with grpc.aio.insecure_channel(server.address) as channel:
            for i in range(300):
                error = await send_garbage(channel, methods[i % len(methods)])
                assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, error
                assert str(error.details()).startswith("malformed request: Error parsing message")
            snapshot = await cpb_grpc.ClusterHealthServiceStub(channel).GetClusterSnapshot(
                cpb.GetClusterSnapshotRequest(), timeout=10
            )
            assert snapshot.snapshot.controller_instance_id  # the channel still serves
        elapsed = time.monotonic() - started
        assert server.malformed_requests() == 300
        assert server.servicer.subscribers == 0
    assert all(record.exc_info is None for record in caplog.records)
    assert [
        r for r in caplog.records if r.name.startswith("grpc") and r.levelno > logging.INFO
    ] == []
    lines = [r.getMessage() for r in caplog.records if r.name == "capwatch.server.malformed"]
    assert 1 <= len(lines) <= allowed_lines(elapsed), lines
    assert lines[0].startswith("malformed request refused method=/capwatch.v1.")
    assert "\n" not in "".join(lines)


@pytest.mark.parametrize(
    ("heartbeat", "detail"),
    [
        (Duration(seconds=2**62), "is not a valid Duration"),  # past a timedelta
        (Duration(seconds=-(2**62)), "is not a valid Duration"),
        (Duration(seconds=315_576_000_000), "must be between 1s and 3600s, got 3.15576e+11s"),
        (Duration(seconds=3601), "must be between 1s and 3600s"),
        (Duration(nanos=500_000_000), "must be between 1s and 3600s"),
        (Duration(seconds=-1), "must be between 1s and 3600s"),
        (Duration(seconds=5, nanos=-1), "is not a valid Duration"),
        (Duration(seconds=5, nanos=2_000_000_000), "is not a valid Duration"),
    ],
    ids=[
        "huge",
        "hugely-negative",
        "ten-thousand-years",
        "over-an-hour",
        "under-a-second",
        "negative",
        "signs",
        "nanos",
    ],
)
async def test_an_out_of_range_heartbeat_is_invalid_argument_without_a_traceback(
    heartbeat: Duration, detail: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A Watch asking for a heartbeat the range does not allow, or no Duration at all (a
    heartbeat of 2**62 s raised OverflowError in ToTimedelta() and answered UNKNOWN with a
    traceback): INVALID_ARGUMENT naming heartbeat_interval, no slot held, nothing logged."""
    caplog.set_level(logging.DEBUG)
    async with serving() as server, grpc.aio.insecure_channel(server.address) as channel:
        request = cpb.ClusterHealthServiceWatchRequest(heartbeat_interval=heartbeat)
        call = cpb_grpc.ClusterHealthServiceStub(channel).Watch(request, timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call.read()
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert str(caught.value.details()).startswith("heartbeat_interval ")
        assert detail in str(caught.value.details())
        assert server.servicer.subscribers == 0
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_a_valid_heartbeat_is_honoured() -> None:
    """A heartbeat of 1 s (the floor) is accepted: the snapshot, then a heartbeat."""
    async with serving() as server, grpc.aio.insecure_channel(server.address) as channel:
        request = cpb.ClusterHealthServiceWatchRequest(heartbeat_interval=Duration(seconds=1))
        call = cpb_grpc.ClusterHealthServiceStub(channel).Watch(request, timeout=30)
        assert (await call.read()).WhichOneof("event") == "snapshot"
        assert (await call.read()).WhichOneof("event") == "heartbeat"
        call.cancel()


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


async def watch(channel: grpc.aio.Channel) -> Any:
    """A Watch that got its snapshot (it holds a slot), or the refusal's details."""
    call = cpb_grpc.ClusterHealthServiceStub(channel).Watch(
        cpb.ClusterHealthServiceWatchRequest(), timeout=60
    )
    try:
        first = await call.read()
    except grpc.aio.AioRpcError as exc:
        refused = exc
    else:
        assert first.WhichOneof("event") == "snapshot"
        return call
    assert refused.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, refused
    return str(refused.details())


@pytest.mark.skipif(not ipv6_loopback(), reason="needs ::1 as a second client address")
async def test_one_client_address_cannot_lock_everyone_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """6 slots, 3 per address: a client at 127.0.0.1 opening streams until refused gets 3
    (refused: the limit per address, with slots left); a dashboard at ::1 still gets its
    Watch; when one of the first client's streams ends, it may open one again. Each
    refusal is a throttled line. (Before: the first client took all 6, and every other
    Watch was RESOURCE_EXHAUSTED.)"""
    caplog.set_level(logging.WARNING, logger="capwatch.controller.cluster.serving")
    async with (
        serving("[::]:0", max_subscribers=6, max_per_peer=3) as server,
        grpc.aio.insecure_channel(f"127.0.0.1:{server.address.rsplit(':', 1)[1]}") as greedy,
        grpc.aio.insecure_channel(f"[::1]:{server.address.rsplit(':', 1)[1]}") as dashboard,
    ):
        held = []
        for _ in range(7):
            opened = await watch(greedy)
            if isinstance(opened, str):
                break
            held.append(opened)
        assert len(held) == 3
        assert opened == "stream limit per client address (3) reached for 127.0.0.1"
        assert server.servicer.subscribers == 3

        theirs = await watch(dashboard)
        assert not isinstance(theirs, str), theirs
        assert server.servicer.subscribers == 4

        held.pop().cancel()
        async with asyncio.timeout(30):
            while server.servicer.subscribers != 3:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        again = await watch(greedy)
        assert not isinstance(again, str), again
        for call in (*held, theirs, again):
            call.cancel()
    refused = [
        r.getMessage() for r in caplog.records if r.name == "capwatch.controller.cluster.serving"
    ]
    assert len(refused) == 1
    assert refused[0].startswith("cluster stream refused peer=ipv")
    assert "127.0.0.1" in refused[0]
    assert "reason=peer_limit" in refused[0]


async def test_the_whole_limit_still_holds() -> None:
    """Whatever the addresses, no more than max_subscribers streams: with 2 slots and no
    limit per address, the third is refused naming the subscriber limit."""
    async with (
        serving(max_subscribers=2, max_per_peer=None) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        first, second = await watch(channel), await watch(channel)
        assert await watch(channel) == "subscriber limit (2) reached"
        first.cancel()
        second.cancel()
