"""Electors on the virtual loop over one in-memory Lease store (tests/controller/fakes.py),
and what each was told: the rig of tests/controller/test_leasing*.py."""

from __future__ import annotations

import asyncio
import random

from capwatch.controller.leasing import JITTER_FACTOR, LeaseConfig, LeaseElector
from tests.controller.fakes import LeaseClient, LeaseStore
from tests.controller.virtual_time import LoopClock

NAME = "capwatch-controller-0"
CONFIG = LeaseConfig()  # 15 s lease, 10 s renew deadline, 2 s retry
MAX_RETRY_S = CONFIG.retry_s * (1 + JITTER_FACTOR)  # a follower's longest wait between tries


class Replica:
    """One elector, its API connection, and what it was told, with times."""

    def __init__(
        self,
        store: LeaseStore,
        identity: str,
        *,
        config: LeaseConfig = CONFIG,
        clock: LoopClock | None = None,
        seed: int = 0,
        api: LeaseClient | None = None,
    ) -> None:
        self.clock = clock or LoopClock()
        self.api: LeaseClient = api or store.client(identity)
        self.started: list[float] = []
        self.stopped: list[float] = []
        self.leading_calls: list[bool] = []
        self.holder_changes = 0
        self.fenced_outs = 0
        self.elector = LeaseElector(
            api=self.api,
            name=NAME,
            identity=identity,
            clock=self.clock,
            config=config,
            on_started=lambda: self.started.append(self.clock.monotonic()),
            on_stopped=lambda: self.stopped.append(self.clock.monotonic()),
            observer=self,
            rng=random.Random(seed),
        )
        self.task: asyncio.Task[None] | None = None

    # LeaseObserver
    def leading(self, leading: bool) -> None:
        self.leading_calls.append(leading)

    def holder_changed(self) -> None:
        self.holder_changes += 1

    def fenced_out(self) -> None:
        self.fenced_outs += 1

    def start(self) -> Replica:
        self.task = asyncio.create_task(self.elector.run(), name=f"elector-{self.elector.identity}")
        return self

    async def crash(self) -> None:
        """Stop campaigning without releasing (a killed process, as far as the Lease sees)."""
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def shutdown(*replicas: Replica) -> None:
    for replica in replicas:
        if replica.task is not None and not replica.task.done():
            await replica.crash()
