"""Fixtures: the kubelet's API compiled once per session, and servers stopped after each test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import pytest_asyncio

from capwatch.server.settings import ServerSettings
from tests.dra.kubelet_api import KubeletApi, compile_descriptor_set, load
from tests.server.harness import ServerHarness, start_harness

Serve = Callable[..., Awaitable[ServerHarness]]


@pytest.fixture(scope="session")
def kubelet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, KubeletApi]:
    """Each version of the kubelet's API, by version name, from a fresh descriptor pool."""
    return load(compile_descriptor_set(tmp_path_factory.mktemp("kubelet-proto")))


@pytest_asyncio.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start real servers (127.0.0.1:0) with a given interval; all are stopped afterwards."""
    started: list[ServerHarness] = []

    async def start(
        *, interval_s: float = 0.5, settings: ServerSettings | None = None
    ) -> ServerHarness:
        harness = await start_harness(interval_s=interval_s, settings=settings)
        started.append(harness)
        return harness

    yield start
    for harness in started:
        await harness.server.stop()
