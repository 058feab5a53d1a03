"""Fixtures: a harness server whose hub a Metrics registry follows, as in the agent."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest_asyncio

from capwatch.server.metrics.cycle_metrics import Metrics
from tests.metrics.support import Series, eventually, scrape
from tests.server.harness import ServerHarness, start_harness


@dataclass
class Followed:
    harness: ServerHarness
    metrics: Metrics
    task: asyncio.Task[None]

    async def settle(self, timeout: float = 2.0) -> dict[Series, float]:
        """Scrape once the registry has folded everything published so far."""
        target = self.harness.hub.state().sequence
        await eventually(lambda: self.metrics.folded_sequence >= target, timeout=timeout)
        return scrape(self.metrics.registry)


@pytest_asyncio.fixture
async def followed() -> AsyncIterator[Followed]:
    """The harness (3 GPUs, 0.5 s interval) and a Metrics following its hub."""
    harness = await start_harness()
    metrics = Metrics(publication=harness.publication, version="9.9.9-test")
    task = asyncio.create_task(metrics.follow(), name="capwatch-metrics")
    yield Followed(harness=harness, metrics=metrics, task=task)
    await harness.server.stop()  # releases the hub's readers: follow() returns
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(task, 2)
