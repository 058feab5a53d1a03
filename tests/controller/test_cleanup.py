"""The uninstall cleanup's deadlines and retries (controller/cleanup.py), on virtual time:
each request's own deadline, the whole run's, pages retried from their own token, the list
started over when its token expired, and what was left named one object per line."""

from __future__ import annotations

import asyncio
import copy
import io
import random
from collections.abc import Callable
from typing import Any

import pytest

from capwatch.controller.cleanup import clean
from capwatch.controller.conditions import CONDITION_TYPE
from capwatch.controller.errors import ApiError, NotFound
from capwatch.controller.kube import NODES, TAINT_RULES
from capwatch.controller.settings import CleanupLimits
from capwatch.controller.taints import TaintPolicy
from tests.controller.virtual_time import LoopClock

LIMITS = CleanupLimits(request_s=10.0, overall_s=240.0)
POLICY = TaintPolicy(release="capwatch", enabled=True, effects={}, hold_down_s=60.0)
Fault = Callable[[str], ApiError | None]


def _node(name: str, *, ours: bool = True) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True"}]
    if ours:
        conditions.append({"type": CONDITION_TYPE, "status": "True", "reason": "CapsEnforced"})
    return {"metadata": {"name": name}, "status": {"conditions": conditions}}


class FakeApi:
    """Nodes and rules in pages of ``page_size``; ``faults[what]`` says, per call, the
    error to raise (None: answer). ``what`` is ``list NODES page N``, ``node NAME``,
    ``list TAINT_RULES page N`` or ``rule NAME``."""

    def __init__(self, nodes: list[dict[str, Any]], rules: list[str], *, page_size: int = 2):
        self.nodes = {n["metadata"]["name"]: copy.deepcopy(n) for n in nodes}
        self.rules = set(rules)
        self.page_size = page_size
        self.faults: dict[str, Fault] = {}
        self.calls: list[tuple[str, float, float]] = []  # what, when, its deadline_s
        self.hang: set[str] = set()  # calls that get no answer within their deadline

    async def _called(self, what: str, deadline_s: float) -> None:
        self.calls.append((what, asyncio.get_running_loop().time(), deadline_s))
        if what in self.hang:
            await asyncio.sleep(deadline_s)
            raise ApiError(f"{what}: timed out")
        fault = self.faults.get(what)
        error = fault(what) if fault is not None else None
        if error is not None:
            raise error

    async def list_page(
        self, path: str, *, label_selector: str, token: str, deadline_s: float
    ) -> tuple[list[dict[str, Any]], str]:
        start = int(token or "0")
        kind = "nodes" if path == NODES else "rules"
        await self._called(f"list {kind} page {start // self.page_size + 1}", deadline_s)
        if path == NODES:
            items = sorted(self.nodes)
            objects = [self.nodes[n] for n in items[start : start + self.page_size]]
        else:
            assert path == TAINT_RULES
            assert label_selector == POLICY.selector()
            objects = [{"metadata": {"name": r}} for r in sorted(self.rules)]
            objects = objects[start : start + self.page_size]
            items = sorted(self.rules)
        following = start + self.page_size
        return objects, str(following) if following < len(items) else ""

    async def remove_condition(self, node: str, *, deadline_s: float) -> None:
        await self._called(f"node {node}", deadline_s)
        if node not in self.nodes:
            raise NotFound(f"node {node}", status=404)
        conditions = self.nodes[node]["status"]["conditions"]
        self.nodes[node]["status"]["conditions"] = [
            c for c in conditions if c["type"] != CONDITION_TYPE
        ]

    async def delete_taint_rule(self, name: str, *, deadline_s: float) -> None:
        await self._called(f"rule {name}", deadline_s)
        self.rules.discard(name)

    def carriers(self) -> list[str]:
        return sorted(
            n
            for n, node in self.nodes.items()
            if any(c["type"] == CONDITION_TYPE for c in node["status"]["conditions"])
        )


def times(count: int, error: Callable[[], ApiError]) -> Fault:
    """The first ``count`` calls fail with ``error()``, then they answer."""
    left = [count]

    def fault(_: str) -> ApiError | None:
        if left[0] <= 0:
            return None
        left[0] -= 1
        return error()

    return fault


def always(error: Callable[[], ApiError]) -> Fault:
    return lambda _: error()


async def _clean(api: FakeApi, *, limits: CleanupLimits = LIMITS) -> tuple[int, list[str]]:
    out = io.StringIO()
    code = await clean(
        api, limits=limits, taints=POLICY, out=out, clock=LoopClock(), rng=random.Random(7)
    )
    return code, out.getvalue().splitlines()


NODES_SIX = [_node(f"gpu-{i}") for i in range(5)] + [_node("cpu-0", ours=False)]


@pytest.mark.asyncio
async def test_every_page_and_node_cleaned_with_each_requests_deadline() -> None:
    """Nodes are read a page at a time; each carrier is patched; every request is given
    the request timeout as its deadline; nothing left, exit 0."""
    api = FakeApi(NODES_SIX, ["capwatch-r1"])
    code, lines = await _clean(api)
    assert code == 0, lines
    assert lines == [
        f"removed {CONDITION_TYPE} from 5 of 6 nodes",
        "removed 1 of 1 DeviceTaintRules",
    ]
    assert api.carriers() == []
    assert api.rules == set()
    assert {deadline for _, _, deadline in api.calls} == {LIMITS.request_s}
    pages = [what for what, _, _ in api.calls if what.startswith("list nodes")]
    assert pages == ["list nodes page 1", "list nodes page 2", "list nodes page 3"]


@pytest.mark.asyncio
async def test_a_failing_page_is_retried_from_its_own_token() -> None:
    """A page that fails (500, no answer, 429 with Retry-After) is asked again, from its
    own continue token, not from the first page; the 429's Retry-After is waited."""
    api = FakeApi(NODES_SIX, [])
    api.faults["list nodes page 2"] = times(3, lambda: ApiError("HTTP 500", status=500))
    api.faults["list nodes page 3"] = times(
        1, lambda: ApiError("HTTP 429", status=429, retry_after=7.0)
    )
    code, lines = await _clean(api)
    assert code == 0, lines
    pages = [(what, at) for what, at, _ in api.calls if what.startswith("list nodes")]
    assert [what for what, _ in pages] == [
        "list nodes page 1",
        *["list nodes page 2"] * 4,
        *["list nodes page 3"] * 2,
    ]
    assert pages[-1][1] - pages[-2][1] >= 7.0
    assert api.carriers() == []


@pytest.mark.asyncio
async def test_an_expired_continue_token_starts_the_list_again() -> None:
    """410 on a continue token: the list is read again from its first page, and every
    carrier is still cleaned (those already clean are not patched twice)."""
    api = FakeApi(NODES_SIX, [])
    api.faults["list nodes page 3"] = times(1, lambda: ApiError("expired", status=410))
    code, lines = await _clean(api)
    assert code == 0, lines
    assert lines[0] == f"removed {CONDITION_TYPE} from 5 of 6 nodes"
    pages = [what for what, _, _ in api.calls if what.startswith("list nodes")]
    assert pages == [
        "list nodes page 1",
        "list nodes page 2",
        "list nodes page 3",
        "list nodes page 1",
        "list nodes page 2",
        "list nodes page 3",
    ]
    patched = [what for what, _, _ in api.calls if what.startswith("node ")]
    assert sorted(patched) == sorted(f"node gpu-{i}" for i in range(5))
    assert api.carriers() == []


@pytest.mark.asyncio
async def test_refused_for_good_is_named_and_the_rest_cleaned() -> None:
    """A node refused 403 is not retried; every other node is cleaned; the log names it
    on a line of its own and the run exits 1."""
    api = FakeApi(NODES_SIX, ["capwatch-r1"])
    api.faults["node gpu-2"] = always(lambda: ApiError("HTTP 403 forbidden", status=403))
    code, lines = await _clean(api)
    assert code == 1
    assert api.carriers() == ["gpu-2"]
    assert [what for what, _, _ in api.calls].count("node gpu-2") == 1
    assert lines == [
        f"removed {CONDITION_TYPE} from 4 of 6 nodes",
        "removed 1 of 1 DeviceTaintRules",
        "capwatch controller cleanup: 1 left:",
        "  node gpu-2: HTTP 403 forbidden",
    ]


@pytest.mark.asyncio
async def test_a_server_that_never_answers_ends_at_the_runs_deadline_naming_what_is_left() -> None:
    """Every node patch fails 503 for ever: each is retried with backoff until its next
    wait would pass the whole run's deadline; each node left is named on a line of its
    own; the rules' pass still runs in what is left."""
    api = FakeApi(NODES_SIX, ["capwatch-r1"])
    for i in range(5):
        api.faults[f"node gpu-{i}"] = always(lambda: ApiError("HTTP 503", status=503))
    limits = CleanupLimits(request_s=10.0, overall_s=60.0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    code, lines = await _clean(api, limits=limits)
    assert code == 1
    assert loop.time() - started <= limits.overall_s
    assert lines[0] == f"removed {CONDITION_TYPE} from 0 of 6 nodes"
    assert lines[1:3] == [
        "removed 1 of 1 DeviceTaintRules",
        "capwatch controller cleanup: 5 left:",
    ]
    left = lines[3:]
    assert [line.split(":")[0] for line in left] == [f"  node gpu-{i}" for i in range(5)]
    assert all("HTTP 503 (out of time after" in line for line in left), left
    tries = [what for what, _, _ in api.calls].count("node gpu-0")
    assert tries >= 5  # backoff from 0.5 s doubling to 10 s fits several in 60 s
    last = max(at for what, at, _ in api.calls if what.startswith("node "))
    assert last - started < limits.overall_s


@pytest.mark.asyncio
async def test_a_request_never_outlives_the_run() -> None:
    """A request that gets no answer takes its whole request timeout; the retry after it
    is given only what is left of the run, and the run ends on time."""
    api = FakeApi([_node("gpu-0")], [])
    api.hang.add("node gpu-0")
    limits = CleanupLimits(request_s=10.0, overall_s=12.0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    code, lines = await _clean(api, limits=limits)
    deadlines = [d for what, _, d in api.calls if what == "node gpu-0"]
    assert deadlines[0] == 10.0
    assert 0 < deadlines[1] <= 2.0
    assert code == 1
    assert lines[-2].startswith("  node gpu-0: ")
    assert lines[-1].startswith("  DeviceTaintRules: cannot list them: out of time")
    assert loop.time() - started <= limits.overall_s


@pytest.mark.asyncio
async def test_a_list_refused_midway_names_what_was_not_listed() -> None:
    """Page 2 of the node list refused for good: the first page's nodes are cleaned, the
    rest is named as not listed, and the rules' pass still runs."""
    api = FakeApi(NODES_SIX, ["capwatch-r1"])
    api.faults["list nodes page 2"] = always(lambda: ApiError("HTTP 403 forbidden", status=403))
    code, lines = await _clean(api)
    assert code == 1
    assert lines == [
        f"removed {CONDITION_TYPE} from 1 of 2 nodes",
        "removed 1 of 1 DeviceTaintRules",
        "capwatch controller cleanup: 1 left:",
        "  nodes after the first 2 listed: cannot list them: HTTP 403 forbidden",
    ]
    assert api.carriers() == [f"gpu-{i}" for i in range(1, 5)]
