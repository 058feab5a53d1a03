"""Who owns ``GPUPowerCapEnforced`` on a real kube-apiserver: the controller's writer, with
its real API client, applies the condition under its field manager, takes it over from
the strategic-merge patches of capwatch versions before server-side apply, and leaves it
to another manager that owns it (the fake server models no field ownership)."""

from __future__ import annotations

import asyncio
import random

import pytest

from capwatch.controller.conditions import AgentLink, Condition, ConditionReason, ConditionStatus
from capwatch.controller.conditions import NodeObservation as Observation
from capwatch.controller.kube import KubeApi
from capwatch.controller.objects import node_condition
from capwatch.controller.tracking import NodeState
from capwatch.controller.writes.recorder import EventRecorder
from capwatch.controller.writes.writer import CONFLICT_REASON, ConditionWriter
from capwatch.kit.clock import SystemClock
from tests.controller.fakes import FakeEventApi, ManualFence
from tests.controller.writing_rig import Observer
from tests.kube.rawapi import call
from tests.kube.realserver import RealApiServer

pytestmark = pytest.mark.timeout(120)

NODE_STATUS = "/api/v1/nodes/{}/status"
SMP = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"


def _state(node: str, status: ConditionStatus, reason: ConditionReason) -> NodeState:
    return NodeState(
        observation=Observation(node=node, link=AgentLink.CONNECTED),
        condition=Condition(status=status, reason=reason, message="from the writer"),
        cycle_end_at=None,
    )


def _ours(status: str, reason: str) -> dict[str, object]:
    return {
        "type": "GPUPowerCapEnforced",
        "status": status,
        "reason": reason,
        "message": "m",
        "lastTransitionTime": "2026-12-04T00:00:00Z",
        "lastHeartbeatTime": "2026-12-04T00:00:00Z",
    }


async def _written(real: RealApiServer, node: str, reason: str) -> dict[str, object]:
    for _ in range(100):
        current = real.node(node) or {}
        condition = node_condition(current)
        if condition is not None and condition.reason == reason:
            return current
        await asyncio.sleep(0.05)
    raise AssertionError(f"{node} never carried reason {reason}: {real.node(node)}")


@pytest.mark.asyncio
async def test_the_writer_applies_takes_over_its_past_and_leaves_another_managers(
    real: RealApiServer,
) -> None:
    """Node a carries the condition from an old capwatch's strategic-merge patch: the
    writer's apply is refused (409), it reads the owners, finds only capwatch's past and
    forces: managedFields then name capwatch-controller's Apply. Node b's condition is
    another release's (applied by ``other-controller``): the writer never forces it,
    counts a conflict, posts one Warning Event naming the owner and leaves the Node as
    the other release wrote it."""
    for node in ("ssa-a", "ssa-b"):
        real.add_node(node)
    legacy = real.client("capwatch-controller/old-pod")
    answer = call(
        legacy,
        "PATCH",
        NODE_STATUS.format("ssa-a"),
        body={"status": {"conditions": [_ours("True", "CapsEnforced")]}},
        content_type=SMP,
    )
    assert answer.status == 200, answer.body
    other = real.client("other-controller/pod")
    applied = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "ssa-b"},
        "status": {"conditions": [_ours("True", "CapsEnforced")]},
    }
    answer = call(
        other,
        "PATCH",
        NODE_STATUS.format("ssa-b"),
        query={"fieldManager": "other-controller"},
        body=applied,
        content_type=APPLY,
    )
    assert answer.status == 200, answer.body

    clock = SystemClock()
    api = KubeApi(real.client("capwatch-controller/r0"), namespace="default", identity="r0")
    fence = ManualFence(10.0, clock=clock)
    events = FakeEventApi(clock=clock)
    observer = Observer()
    writer = ConditionWriter(
        api=api,
        events=EventRecorder(api=events, fence=fence, clock=clock),
        fence=fence,
        clock=clock,
        observer=observer,
        rng=random.Random(1),
    )
    writer.start()
    try:
        for node in ("ssa-a", "ssa-b"):
            writer.node_changed(
                _state(node, ConditionStatus.FALSE, ConditionReason.CAP_WRITE_FAILED)
            )
        node_a = await _written(real, "ssa-a", "CapWriteFailed")
        managers = {
            (m["manager"], m["operation"])
            for m in node_a["metadata"]["managedFields"]  # type: ignore[index]
        }
        assert ("capwatch-controller", "Apply") in managers
        for _ in range(100):
            if observer.count("conflict"):
                break
            await asyncio.sleep(0.05)
    finally:
        await writer.stop()
        api.close()
    assert observer.count("ok") == 1
    assert observer.count("conflict") > 0
    node_b = real.node("ssa-b") or {}
    condition_b = node_condition(node_b)
    assert condition_b is not None
    assert condition_b.reason == "CapsEnforced"
    (said,) = [e for e in events.events if e.reason == CONFLICT_REASON]
    assert said.node == "ssa-b"
    assert "other-controller" in said.message
