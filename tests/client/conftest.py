"""Fixtures: real agent servers (tests/server/harness.py) for the client to subscribe to."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from tests.server.harness import ServerHarness, start_harness


@pytest_asyncio.fixture
async def servers() -> AsyncIterator[list[ServerHarness]]:
    """Harnesses a test starts (or restarts) go here; any still serving are stopped after."""
    started: list[ServerHarness] = []
    yield started
    for harness in started:
        if not harness.publication.stopping.is_set():
            await harness.server.stop()


@pytest_asyncio.fixture
async def harness(servers: list[ServerHarness]) -> ServerHarness:
    """A real server on 127.0.0.1:0, interval 0.5 s; nothing published yet."""
    started = await start_harness()
    servers.append(started)
    return started
