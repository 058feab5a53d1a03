"""The DeviceTaintRule writer's test rig: a fake API holding rules (as the real server
does: names unique, resourceVersions checked), nodes' states with faulted GPUs, and a
writer over them on the virtual loop's clock."""

from __future__ import annotations

import copy
import itertools
import random
from collections.abc import Sequence
from typing import Any

from capwatch.controller.conditions import (
    AgentLink,
    Condition,
    ConditionReason,
    ConditionStatus,
    CycleSummary,
    GpuSummary,
    NodeObservation,
)
from capwatch.controller.errors import ApiError, NotFound
from capwatch.controller.taints import Effect, TaintPolicy
from capwatch.controller.tracking import NodeState
from capwatch.controller.writes.recorder import EventRecorder
from capwatch.controller.writes.taints import TaintWriter
from tests.controller.fakes import FakeEventApi, ManualFence
from tests.controller.virtual_time import LoopClock

DRIVER = "gpu.nvidia.com"
RELEASE = "capwatch"


class FakeTaintApi:
    """DeviceTaintRules in memory; every write logged with the loop time it came."""

    def __init__(self, clock: LoopClock) -> None:
        self.rules: dict[str, dict[str, Any]] = {}
        self.writes: list[tuple[float, str, str]] = []  # (when, action, name)
        self.failures: list[BaseException] = []
        self.lists = 0
        self._clock = clock
        self._versions = itertools.count(1)

    async def list_taint_rules(
        self, *, label_selector: str, deadline_s: float
    ) -> list[dict[str, Any]]:
        self.lists += 1
        wanted = dict(term.split("=", 1) for term in label_selector.split(","))
        return [
            copy.deepcopy(rule)
            for rule in self.rules.values()
            if all(rule["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())
        ]

    def _fail(self) -> None:
        if self.failures:
            raise self.failures.pop(0)

    async def apply_taint_rule(
        self, name: str, body: dict[str, Any], *, deadline: float
    ) -> dict[str, Any]:
        """As the API server applies for its only field manager: the rule as given,
        created if absent (counted ``create``), else replaced (``update``)."""
        assert body["metadata"]["name"] == name
        assert "resourceVersion" not in body["metadata"]  # an apply is not conditional
        self._fail()
        action = "update" if name in self.rules else "create"
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(next(self._versions))
        self.rules[name] = stored
        self.writes.append((self._clock.monotonic(), action, name))
        return copy.deepcopy(stored)

    async def delete_taint_rule(self, name: str, *, deadline: float) -> None:
        self._fail()
        if name not in self.rules:
            raise NotFound(f"devicetaintrules {name} not found", status=404)
        del self.rules[name]
        self.writes.append((self._clock.monotonic(), "delete", name))

    def taints(self) -> dict[str, tuple[str, str, str]]:
        """Rule name -> (device, category, effect)."""
        return {
            name: (
                rule["spec"]["deviceSelector"]["device"],
                rule["spec"]["taint"]["value"],
                rule["spec"]["taint"]["effect"],
            )
            for name, rule in self.rules.items()
        }

    def count(self, action: str) -> int:
        return sum(1 for _, a, _ in self.writes if a == action)


class Observer:
    def __init__(self) -> None:
        self.results: list[tuple[str, str]] = []
        self.rules = 0

    def taint_written(self, *, action: str, result: str) -> None:
        self.results.append((action, result))

    def taint_rules(self, count: int) -> None:
        self.rules = count


def gpu(
    index: int,
    *kinds: str,
    node: str = "n1",
    named: bool = True,
) -> GpuSummary:
    """A GPU of ``node`` with faults of ``kinds``; ``named``: its slice names it."""
    return GpuSummary(
        index=index,
        uuid=f"GPU-{node}-{index}",
        healthy=not kinds,
        outcome="enforced",
        reason="ok",
        message="m",
        faults=tuple(f"fault {k}" for k in kinds),
        fault_kinds=kinds,
        dra_device=(DRIVER, node, f"gpu-{index}") if named and kinds else None,
    )


def state(
    node: str, gpus: Sequence[GpuSummary], *, link: AgentLink = AgentLink.CONNECTED
) -> NodeState:
    cycle = CycleSummary(
        sequence=1,
        enforced=True,
        abort_reason="",
        failure_kinds=(),
        failure_summary="",
        gpus=tuple(gpus),
        finished_at=0.0,
        finished_wall=0.0,
    )
    return NodeState(
        observation=NodeObservation(node=node, link=link, cycle=cycle, gpus=tuple(gpus)),
        condition=Condition(
            status=ConditionStatus.TRUE, reason=ConditionReason.CAPS_ENFORCED, message="ok"
        ),
    )


class Rig:
    def __init__(
        self,
        *,
        effects: dict[str, Effect] | None = None,
        hold_down_s: float = 60.0,
        qps: float = 20.0,
        burst: int = 40,
        ours: set[str] | None = None,
        known: set[str] | None = None,
    ) -> None:
        self.clock = LoopClock()
        self.api = FakeTaintApi(self.clock)
        self.events = FakeEventApi()
        self.fence = ManualFence(10.0)
        self.observer = Observer()
        self.known = known if known is not None else {"n1", "n2"}
        self.policy = TaintPolicy(release=RELEASE, effects=effects or {}, hold_down_s=hold_down_s)
        self.writer = TaintWriter(
            api=self.api,
            events=EventRecorder(api=self.events, fence=self.fence, clock=self.clock),
            fence=self.fence,
            clock=self.clock,
            policy=self.policy,
            ours=(lambda node: True) if ours is None else (lambda node: node in ours),
            known=lambda node: node in self.known,
            qps=qps,
            burst=burst,
            observer=self.observer,
            rng=random.Random(3),
        )

    def start(self, *, leading: bool = True) -> None:
        self.writer.start()
        if leading:
            self.writer.resume()


def failure(status: int = 500) -> ApiError:
    return ApiError("injected", status=status)
