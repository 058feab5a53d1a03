"""Fixtures: a started ServerHarness per test, stopped afterwards."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from tests.server.harness import ServerHarness, start_harness


@pytest_asyncio.fixture
async def harness() -> AsyncIterator[ServerHarness]:
    """A real server on 127.0.0.1:0 with a 0.5 s interval (stale after 1.5 s)."""
    started = await start_harness()
    yield started
    await started.server.stop()
