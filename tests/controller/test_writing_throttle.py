"""The condition writer under a server that throttles (controller/writes/writer.py): a 429
pauses the whole queue and the node keeps its place, so nodes are written in the order
they came and none twice while another waits; other failures keep their place too.

Time is the virtual loop's: the server's rate and every pause are exact."""

from __future__ import annotations

import asyncio
import collections
import itertools

import pytest

from capwatch.controller.conditions import NodeCondition
from capwatch.controller.errors import ApiError
from capwatch.controller.objects import FieldOwner
from capwatch.controller.writes.writer import RETRY_MAX_S
from tests.controller.fakes import FakeConditionApi
from tests.controller.writing_rig import TRUE, WRITE_FAILED, Rig, key, settle


class ThrottlingApi:
    """A ConditionApi that takes at most ``per_second`` writes in each second of loop time
    and answers the rest 429 with Retry-After: 1, as the API server's priority and
    fairness does when a flow's queue is full."""

    def __init__(self, inner: FakeConditionApi, *, per_second: int) -> None:
        self.inner = inner
        self.per_second = per_second
        self.taken: collections.Counter[int] = collections.Counter()
        self.refused = 0

    async def apply_condition(
        self, node: str, condition: NodeCondition, *, deadline: float, force: bool = False
    ) -> int | None:
        second = int(asyncio.get_running_loop().time())
        if self.taken[second] >= self.per_second:
            self.refused += 1
            raise ApiError("too many requests", status=429, retry_after=1.0)
        self.taken[second] += 1
        return await self.inner.apply_condition(node, condition, deadline=deadline, force=force)

    async def condition_owners(self, node: str, *, deadline: float) -> tuple[FieldOwner, ...]:
        return await self.inner.condition_owners(node, deadline=deadline)


@pytest.mark.asyncio
async def test_under_sustained_429s_nodes_are_written_in_the_order_they_came() -> None:
    """200 nodes fail at once; the server takes 5 writes a second and turns the rest away
    with 429: every node is written exactly once, in the order the nodes failed (none
    overtakes another, none is written twice while another waits), at the server's rate
    (40 s for 200, within one pause of it), and the throttling is counted."""
    rig = Rig(workers=8)
    fake = rig.api
    throttling = ThrottlingApi(fake, per_second=5)
    rig.writer._api = throttling
    start = asyncio.get_running_loop().time()
    nodes = [f"gpu-{i:03}" for i in range(200)]
    for node in nodes:
        rig.change(WRITE_FAILED, node=node)
    for _ in range(120):
        if len(fake.patches) == len(nodes):
            break
        await asyncio.sleep(1)
    assert [p.node for p in fake.patches] == nodes
    took = fake.patches[-1].ended - start
    assert 39.0 <= took <= 41.0, took
    assert throttling.refused > 0
    assert rig.observer.count("throttled") == throttling.refused
    assert rig.observer.count("failed") == 0
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_a_429_pauses_every_write_for_its_retry_after_and_no_longer() -> None:
    """One 429 with Retry-After: 7 holds back the node refused and a node that changes
    meanwhile: both are written 7 s after the refusal, the refused one first."""
    rig = Rig(workers=4)
    rig.api.failures["gpu-a"] = [ApiError("slow down", status=429, retry_after=7.0)]
    rig.change(WRITE_FAILED, node="gpu-a")
    await settle()
    refused_at = asyncio.get_running_loop().time()
    rig.change(WRITE_FAILED, node="gpu-b")
    await asyncio.sleep(6.9)
    assert rig.api.patches == []
    await asyncio.sleep(0.2)
    assert [(p.node, p.started - refused_at) for p in rig.api.patches] == [
        ("gpu-a", 7.0),
        ("gpu-b", 7.0),
    ]
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_429s_without_retry_after_pause_by_the_one_backoff_and_cap_at_its_ceiling() -> None:
    """A server that keeps answering 429 with no Retry-After: the pauses grow by the one
    backoff (full jitter, doubling) and never exceed RETRY_MAX_S; the first success ends
    the run of 429s, so the next pause starts small again."""
    rig = Rig(workers=1)
    rig.api.failures["gpu-a"] = [ApiError("busy", status=429) for _ in range(12)]
    rig.change(WRITE_FAILED, node="gpu-a")
    for _ in range(200):
        if rig.api.patches:
            break
        await asyncio.sleep(RETRY_MAX_S)
    times = [t for _, t, _ in rig.api.attempts]
    assert len(times) == 13
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) <= RETRY_MAX_S
    assert rig.keys("gpu-a") == [key(WRITE_FAILED)]
    rig.api.failures["gpu-b"] = [ApiError("busy", status=429)]
    rig.change(TRUE, node="gpu-b")
    await asyncio.sleep(1.0)  # the first pause of a new run: at most RETRY_INITIAL_S
    assert rig.keys("gpu-b") == [key(TRUE)]
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_a_failed_write_keeps_its_place_ahead_of_work_that_came_after_it() -> None:
    """One worker; gpu-a's write fails (500) and waits its backoff while 20 other nodes
    fail after it: when its retry is due, gpu-a is written next, ahead of those still
    queued, not behind them."""
    rig = Rig(workers=1)
    rig.api.failures["gpu-a"] = [ApiError("boom", status=500)]
    gate = asyncio.Event()
    rig.change(WRITE_FAILED, node="gpu-a")
    await settle()
    rig.api.gates["later-00"] = gate  # holds the worker while gpu-a's retry comes due
    for i in range(20):
        rig.change(WRITE_FAILED, node=f"later-{i:02}")
    await asyncio.sleep(RETRY_MAX_S)
    gate.set()
    for _ in range(30):
        await settle()
    order = [p.node for p in rig.api.patches]
    assert order[:2] == ["later-00", "gpu-a"]
    assert order[2:] == [f"later-{i:02}" for i in range(1, 20)]
    await rig.writer.stop()
