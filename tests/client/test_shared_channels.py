"""Clients of one address sharing one channel (client/channels.py): a controller following
many nodes behind one address holds one connection, which outlives any stream and the
server's restart, and closes with its last client."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from capwatch.client.channels import SharedChannels
from capwatch.client.node_health import Disconnected, NodeHealthClient, Snapshot
from tests.server.harness import running, settings_for

pytestmark = pytest.mark.asyncio


async def _first(client: NodeHealthClient, kind: type) -> object:
    async with asyncio.timeout(10):
        async for event in client.events():
            if isinstance(event, kind):
                return event
    raise AssertionError("the stream ended")


async def test_many_clients_share_one_channel_and_the_last_closes_it() -> None:
    """Twenty clients of one target stream on one channel; it stays open while any holds
    it, a failing stream does not close it, and the last client's close does."""
    channels = SharedChannels()
    async with running() as harness:
        harness.publish()
        clients = [NodeHealthClient(target=harness.target, channels=channels) for _ in range(20)]
        firsts = await asyncio.gather(*(_first(c, Snapshot) for c in clients))
        assert all(isinstance(e, Snapshot) for e in firsts)
        assert len(channels) == 1
        for client in clients[:-1]:
            await client.close()
        assert len(channels) == 1
        await clients[-1].close()
        assert len(channels) == 0


async def test_a_shared_channel_finds_a_server_restarted_at_the_same_address() -> None:
    """The server goes away (the stream is Disconnected) and comes back on the same port:
    the client's next attempt on the same shared channel gets a snapshot again."""
    channels = SharedChannels()
    async with running() as harness:
        harness.publish()
        target = harness.target
        client = NodeHealthClient(target=target, channels=channels)
        events = client.events()
        assert isinstance(await anext(events), Snapshot)
    # The server is gone.
    async with asyncio.timeout(10):
        while not isinstance(await anext(events), Disconnected):
            pass
    async with running(settings=settings_for(target)) as again:
        again.publish()
        async with asyncio.timeout(20):
            while not isinstance(event := await anext(events), Snapshot):
                assert isinstance(event, Disconnected)
    with contextlib.suppress(StopAsyncIteration):
        await events.aclose()
    await client.close()
    assert len(channels) == 0
