"""The condition writer's test rig (tests/controller/test_writing*.py): a writer over fake
APIs on the virtual loop's clock, and what it wrote."""

from __future__ import annotations

import asyncio
import random

from capwatch.controller.conditions import (
    AgentLink,
    Condition,
    ConditionReason,
    ConditionStatus,
    NodeCondition,
    NodeObservation,
)
from capwatch.controller.tracking import NodeState
from capwatch.controller.writes.recorder import EventRecorder
from capwatch.controller.writes.writer import ConditionWriter
from tests.controller.fakes import FakeConditionApi, FakeEventApi, ManualFence
from tests.controller.virtual_time import LoopClock

R = ConditionReason
S = ConditionStatus
NODE = "gpu-1"
TRUE = (S.TRUE, R.CAPS_ENFORCED)
WRITE_FAILED = (S.FALSE, R.CAP_WRITE_FAILED)
RELEASE_FAILED = (S.FALSE, R.RELEASE_FAILED)
UNREACHABLE = (S.UNKNOWN, R.AGENT_UNREACHABLE)


class Observer:
    def __init__(self) -> None:
        self.results: list[tuple[str, float | None]] = []

    def written(self, *, result: str, latency_s: float | None) -> None:
        self.results.append((result, latency_s))

    def count(self, result: str) -> int:
        return sum(1 for r, _ in self.results if r == result)


class Rig:
    def __init__(self, *, heartbeat_s: float = 300.0, workers: int = 4, start: bool = True) -> None:
        self.clock = LoopClock()
        self.api = FakeConditionApi()
        self.events = FakeEventApi()
        self.fence = ManualFence(10.0)
        self.observer = Observer()
        self.writer = ConditionWriter(
            api=self.api,
            events=EventRecorder(api=self.events, fence=self.fence, clock=self.clock),
            fence=self.fence,
            clock=self.clock,
            heartbeat_s=heartbeat_s,
            workers=workers,
            observer=self.observer,
            rng=random.Random(7),
        )
        if start:
            self.writer.start()

    def state(
        self,
        key: tuple[ConditionStatus, ConditionReason],
        message: str = "m",
        *,
        node: str = NODE,
        cycle_age: float | None = None,
    ) -> NodeState:
        """The tracker's state for ``node`` with condition ``key``, its cycle having ended
        ``cycle_age`` seconds ago (None: not a cycle's doing)."""
        end = None if cycle_age is None else self.clock.monotonic() - cycle_age
        return NodeState(
            observation=NodeObservation(node=node, link=AgentLink.CONNECTED),
            condition=Condition(status=key[0], reason=key[1], message=message),
            cycle_end_at=end,
        )

    def change(
        self,
        key: tuple[ConditionStatus, ConditionReason],
        message: str = "m",
        *,
        node: str = NODE,
        cycle_age: float | None = None,
    ) -> None:
        self.writer.node_changed(self.state(key, message, node=node, cycle_age=cycle_age))

    def carried(
        self, key: tuple[ConditionStatus, ConditionReason], *, heartbeat_age: float = 0.0
    ) -> NodeCondition:
        """What a Node carries, as the node watch reads it."""
        wall = self.clock.wall()
        return NodeCondition(
            status=key[0],
            reason=key[1].value,
            message="from the API",
            last_transition_wall=wall - 1000,
            last_heartbeat_wall=wall - heartbeat_age,
        )

    def keys(self, node: str = NODE) -> list[tuple[str, str]]:
        return [c.key for c in self.api.written(node)]


def key(k: tuple[ConditionStatus, ConditionReason]) -> tuple[str, str]:
    return (k[0].value, k[1].value)


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)
