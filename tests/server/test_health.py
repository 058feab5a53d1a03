"""grpc.health.v1 on the agent: SERVING exactly when the readiness rule holds."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from capwatch.server.grpc.health import ListingHealthServicer
from tests.server.harness import ServerHarness, eventually, failed, ok, running, settings_for

pytestmark = pytest.mark.asyncio

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
NAMES = ("", "capwatch.v1.NodeHealthService")


async def check(channel: grpc.aio.Channel, service: str = "") -> int:
    response = await health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=service)
    )
    return int(response.status)


async def becomes(channel: grpc.aio.Channel, status: int, *, timeout: float = 1.0) -> None:
    """Every name reports ``status`` within ``timeout``."""

    async def holds() -> bool:
        return all([await check(channel, name) == status for name in NAMES])

    await eventually(holds, timeout=timeout)


async def next_status(stream: Any, timeout: float = 2) -> int:
    async with asyncio.timeout(timeout):
        return int((await stream.read()).status)


async def test_check_follows_cycles(harness: ServerHarness) -> None:
    """NOT_SERVING before any cycle, SERVING after an enforced one, NOT_SERVING after a failure."""
    async with harness.channel() as channel:
        assert [await check(channel, name) for name in NAMES] == [NOT_SERVING] * 2
        harness.publish()
        await becomes(channel, SERVING)
        harness.publish([ok(0), failed(1), ok(2)])
        await becomes(channel, NOT_SERVING)
        harness.publish()
        await becomes(channel, SERVING)


async def test_check_of_an_unknown_service_is_not_found(harness: ServerHarness) -> None:
    """Only "" and capwatch.v1.NodeHealthService are tracked; other names are NOT_FOUND."""
    async with harness.channel() as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await check(channel, "capwatch.v1.NoSuchService")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def test_no_cycle_within_the_staleness_bound_turns_not_serving() -> None:
    """A hung cycle publishes nothing: the tracker's own timer flips NOT_SERVING at stale_after,
    not before. The flips are read from a health Watch, which reports SERVING however late
    the client gets to read it (a Check would have to land inside the 0.3 s window)."""
    async with running(interval_s=0.1) as harness, harness.channel() as channel:
        stream = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service="capwatch.v1.NodeHealthService")
        )
        assert await next_status(stream) == NOT_SERVING  # no cycle yet
        published = time.monotonic()
        harness.publish()
        assert await next_status(stream) == SERVING
        # No other publish: only the tracker's timer can flip it. The wait is a hang
        # guard (without that timer it would never come), not a bound on when.
        assert await next_status(stream, timeout=10) == NOT_SERVING
        flipped = time.monotonic() - published
        stream.cancel()
        await becomes(channel, NOT_SERVING)  # every name, on Check too
    assert flipped >= 0.3  # not before the bound (3 x 0.1 s)


async def test_health_watch_streams_every_change() -> None:
    """The health Watch RPC reports each flip: none, enforced, failed, enforced, then stale."""
    async with running(interval_s=0.1) as harness, harness.channel() as channel:
        stream = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service="capwatch.v1.NodeHealthService")
        )
        seen = [await next_status(stream)]
        for gpus in ([ok(0), ok(1), ok(2)], [failed(0), ok(1), ok(2)], [ok(0), ok(1), ok(2)]):
            harness.publish(gpus)
            seen.append(await next_status(stream))
        seen.append(await next_status(stream))  # no cycle: stale after 0.3 s
        stream.cancel()
    assert seen == [NOT_SERVING, SERVING, NOT_SERVING, SERVING, NOT_SERVING]


async def test_stop_turns_not_serving_before_the_server_goes() -> None:
    """server.stop() begins with NOT_SERVING for every name (enter_graceful_shutdown)."""
    settings = settings_for(extra={"grpc_grace": "0.2"})
    async with running(settings=settings) as harness, harness.channel() as channel:
        harness.publish()
        await becomes(channel, SERVING)
        streams = [
            health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=name))
            for name in NAMES
        ]
        assert [await next_status(stream) for stream in streams] == [SERVING] * 2
        stopping = asyncio.create_task(harness.server.stop())
        assert [await next_status(stream) for stream in streams] == [NOT_SERVING] * 2
        await stopping


async def list_statuses(channel: grpc.aio.Channel) -> dict[str, int]:
    response = await health_pb2_grpc.HealthStub(channel).List(
        health_pb2.HealthListRequest(), timeout=2
    )
    return {name: int(status.status) for name, status in response.statuses.items()}


async def test_list_answers_every_service_as_check_does(harness: ServerHarness) -> None:
    """Health/List (which reflection lists) answers, not UNIMPLEMENTED: every tracked
    name with the status Check gives it, following the cycles."""
    async with harness.channel() as channel:
        assert await list_statuses(channel) == dict.fromkeys(NAMES, NOT_SERVING)
        harness.publish()
        await becomes(channel, SERVING)
        assert await list_statuses(channel) == dict.fromkeys(NAMES, SERVING)
        harness.publish([ok(0), failed(1), ok(2)])
        await becomes(channel, NOT_SERVING)
        assert await list_statuses(channel) == dict.fromkeys(NAMES, NOT_SERVING)


async def test_list_after_shutdown_began_is_not_serving_for_all() -> None:
    """Once the graceful shutdown began, List says NOT_SERVING for every name, like Check,
    and a readiness change arriving later does not bring one back."""
    health = ListingHealthServicer()
    for name in NAMES:
        await health.set(name, SERVING)
    await health.enter_graceful_shutdown()
    await health.set("", SERVING)
    listed = await health.List(health_pb2.HealthListRequest(), None)
    assert {name: status.status for name, status in listed.statuses.items()} == dict.fromkeys(
        NAMES, NOT_SERVING
    )
