"""--dry-run (controller/dryrun.py): the writes the controller would make, one line each on
standard output, from a writer and recorder that are never fenced."""

from __future__ import annotations

import asyncio
import io
import math
import subprocess
import sys

import pytest

from capwatch.controller.conditions import (
    AgentLink,
    Condition,
    ConditionReason,
    ConditionStatus,
    NodeCondition,
    NodeObservation,
)
from capwatch.controller.dryrun import PrintingApi, Unfenced
from capwatch.controller.tracking import NodeState
from capwatch.controller.writes.recorder import EventRecorder, EventType, NodeEvent
from capwatch.controller.writes.writer import ConditionWriter
from tests.controller.virtual_time import LoopClock


@pytest.mark.asyncio
async def test_a_patch_is_one_line_with_the_message_quoted() -> None:
    """PATCH nodes/NODE/status TYPE=STATUS reason=REASON message="..." (JSON-quoted, so
    quotes and newlines in the message stay on one line)."""
    out = io.StringIO()
    condition = NodeCondition(
        status=ConditionStatus.FALSE,
        reason="CapWriteFailed",
        message='gpu1: write_failed: "no"\nsecond line',
        last_transition_wall=0.0,
        last_heartbeat_wall=0.0,
    )
    await PrintingApi(out).apply_condition("gpu-7", condition, deadline=1.0)
    assert out.getvalue() == (
        "PATCH nodes/gpu-7/status GPUPowerCapEnforced=False reason=CapWriteFailed "
        'message="gpu1: write_failed: \\"no\\"\\nsecond line"\n'
    )


@pytest.mark.asyncio
async def test_an_event_is_one_line() -> None:
    """EVENT TYPE node/NODE REASON: MESSAGE."""
    out = io.StringIO()
    event = NodeEvent(
        node="gpu-7", type=EventType.NORMAL, reason="CapsEnforced", message="ok", wall=0.0
    )
    await PrintingApi(out).create_event(event, deadline=1.0)
    assert out.getvalue() == "EVENT Normal node/gpu-7 CapsEnforced: ok\n"


def test_the_dry_run_fence_never_closes() -> None:
    """With no Lease the replica acts as its shard's leader: its fence never closes (each
    write is bounded by its request timeout alone)."""
    fence = Unfenced()
    assert fence.write_deadline() == math.inf
    assert fence.leading is True
    assert fence.holder == ""


@pytest.mark.asyncio
async def test_a_dry_run_transition_prints_its_patch_then_its_event() -> None:
    """The writer and recorder on PrintingApi and Unfenced print what a leader would write."""
    out = io.StringIO()
    printing, fence, clock = PrintingApi(out), Unfenced(), LoopClock()
    writer = ConditionWriter(
        api=printing,
        events=EventRecorder(api=printing, fence=fence, clock=clock),
        fence=fence,
        clock=clock,
    )
    writer.start()
    writer.node_changed(
        NodeState(
            observation=NodeObservation(node="gpu-7", link=AgentLink.UNREACHABLE),
            condition=Condition(
                status=ConditionStatus.UNKNOWN,
                reason=ConditionReason.AGENT_UNREACHABLE,
                message="the capwatch agent is unreachable",
            ),
        )
    )
    await asyncio.sleep(0.1)
    await writer.stop()
    assert out.getvalue().splitlines() == [
        "PATCH nodes/gpu-7/status GPUPowerCapEnforced=Unknown reason=AgentUnreachable "
        'message="the capwatch agent is unreachable"',
        "EVENT Warning node/gpu-7 AgentUnreachable: the capwatch agent is unreachable",
    ]


def test_a_dry_run_controller_never_loads_the_kubernetes_client(tmp_path) -> None:
    """--dry-run needs no API server, so it must not import the ``kubernetes`` package
    (seconds of start-up and a dependency a laptop demo does not need): the controller
    is parsed, built and its modules imported exactly as ``capwatch controller
    --dry-run`` does, and ``sys.modules`` is read."""
    targets = tmp_path / "nodes.txt"
    targets.write_text("gpu-1 127.0.0.1:50051\n")
    probe = (
        "import sys, os; from capwatch import cli; "
        f"args = cli._parser('controller').parse_args(['controller', '--dry-run', "
        f"'--targets', {str(targets)!r}]); "
        "from capwatch.controller.settings import controller_settings; "
        "settings = controller_settings(args, os.environ); "
        "from capwatch.controller.running import build_controller, run_controller; "
        "build_controller(settings); "
        "print('kubernetes' in sys.modules, 'capwatch.controller.kube' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["False", "False"], done.stderr[-2000:]
