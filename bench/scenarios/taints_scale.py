"""API writes for a mass GPU fault and its recovery: DeviceTaintRules on the real API server.

    .venv/bin/python -m bench.scenarios.taints_scale [--nodes 125] [--gpus 8]

One real kube-apiserver and etcd (tests/realkube, auditing every request). The
controller's DeviceTaintRule writer (controller/writes/taints.py) with the real API
client, as a shard's leader, is told that every GPU of ``--nodes`` nodes (1,000 at
the defaults) faulted in the same cycle, then, once every rule is in place, that all
recovered; the hold-down is ``--hold-down`` seconds. Counted from the audit log: the
writes by verb and resource (rules and Events), the peak writes in any one second, and
how long the rules took to be all in place and all gone. The target: one write per
rule per change, no write beyond that, and the writer's rate limit held.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
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
from capwatch.controller.dryrun import Unfenced
from capwatch.controller.kube import KubeApi, api_client
from capwatch.controller.taints import Effect, TaintPolicy
from capwatch.controller.tracking import NodeState
from capwatch.controller.writes.recorder import EventRecorder
from capwatch.controller.writes.taints import DEFAULT_BURST, DEFAULT_QPS, TaintWriter
from capwatch.kit.clock import SystemClock
from tests.realkube.audit import audited_plane
from tests.realkube.controlplane import build_kube

USER = "capwatch-bench-controller"
RELEASE = "bench"


def node_state(node: str, gpus: int, *, faulted: bool) -> NodeState:
    summaries = tuple(
        GpuSummary(
            index=i,
            uuid=f"GPU-{node}-{i}",
            healthy=not faulted,
            outcome="enforced",
            reason="ok",
            message="capped",
            faults=("XID 79",) if faulted else (),
            fault_kinds=("xid",) if faulted else (),
            dra_device=("gpu.nvidia.com", node, f"gpu-{i}") if faulted else None,
        )
        for i in range(gpus)
    )
    cycle = CycleSummary(
        sequence=1, enforced=True, abort_reason="", failure_kinds=(), failure_summary="",
        gpus=summaries, finished_at=time.monotonic(), finished_wall=time.time(),
    )  # fmt: skip
    return NodeState(
        observation=NodeObservation(
            node=node, link=AgentLink.CONNECTED, cycle=cycle, gpus=summaries
        ),
        condition=Condition(
            status=ConditionStatus.TRUE, reason=ConditionReason.CAPS_ENFORCED, message="ok"
        ),
    )


def audited_writes(path: Path) -> list[tuple[float, str]]:
    """(when, "verb resource") of each of the writer's write requests, at completion."""
    writes = []
    for line in path.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("stage") != "ResponseComplete" or event["verb"] in ("list", "get", "watch"):
            continue
        if event.get("user", {}).get("username") != USER:
            continue
        when = datetime.fromisoformat(event["stageTimestamp"].replace("Z", "+00:00"))
        writes.append((when.timestamp(), f"{event['verb']} {event['objectRef']['resource']}"))
    return writes


async def run(plane: Any, args: argparse.Namespace) -> dict[str, Any]:
    config = plane.component_kubeconfig("bench-controller", USER, ("system:masters",))
    api = KubeApi(api_client(str(config), identity="bench"), namespace="default", identity="bench")
    clock = SystemClock()
    fence = Unfenced()
    nodes = [f"node-{i:04d}" for i in range(args.nodes)]
    writer = TaintWriter(
        api=api,
        events=EventRecorder(api=api, fence=fence, clock=clock),
        fence=fence,
        clock=clock,
        policy=TaintPolicy(
            release=RELEASE, effects={"xid": Effect.NONE}, hold_down_s=args.hold_down
        ),
        ours=lambda node: True,
        known=lambda node: True,
    )
    total = args.nodes * args.gpus
    try:
        writer.start()
        writer.resume()
        began = time.monotonic()
        for node in nodes:
            writer.node_changed(node_state(node, args.gpus, faulted=True))
        # Polled: the writer has no event for "all rules placed", and needs none.
        while len(writer.placed) < total:  # noqa: ASYNC110
            await asyncio.sleep(0.2)
        tainted_s = time.monotonic() - began
        recovered = time.monotonic()
        for node in nodes:
            writer.node_changed(node_state(node, args.gpus, faulted=False))
        while writer.placed:  # noqa: ASYNC110
            await asyncio.sleep(0.2)
        untainted_s = time.monotonic() - recovered
        await writer.stop()
    finally:
        api.close()
    return {"gpus": total, "tainted_s": round(tainted_s, 1), "untainted_s": round(untainted_s, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=125)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--hold-down", type=float, default=5.0)
    args = parser.parse_args(argv)
    binaries = build_kube().cached_binaries()
    if binaries is None:
        print("taints_scale: the control plane is not built: make kube", file=sys.stderr)
        return 1
    with (
        tempfile.TemporaryDirectory(prefix="capwatch-taints-bench-") as scratch,
        audited_plane(Path(scratch), binaries) as plane,
    ):
        figures = asyncio.run(run(plane, args))
        time.sleep(2)  # the audit log's last lines
        writes = audited_writes(Path(scratch) / "audit.log")
    by_kind = collections.Counter(kind for _, kind in writes)
    per_second = collections.Counter(int(when) for when, kind in writes if "devicetaint" in kind)
    gpus = figures["gpus"]
    print(f"taints_scale: {gpus} GPUs fault at once on {args.nodes} nodes, then recover")
    tainted, untainted = figures["tainted_s"], figures["untainted_s"]
    print(f"  all {gpus} rules in place after {tainted} s, all gone {untainted} s after "
          f"the recovery (hold-down {args.hold_down:g} s)")  # fmt: skip
    print(f"  writes: {dict(sorted(by_kind.items()))}")
    rule_writes = sum(n for kind, n in by_kind.items() if "devicetaint" in kind)
    per_change = rule_writes / (2 * gpus)
    print(f"  rule writes {rule_writes} for {2 * gpus} changes (one apply, which creates "
          f"the rule, and one delete per GPU): {per_change:.2f} per change")  # fmt: skip
    print(f"  peak rule writes in one second: {max(per_second.values())} "
          f"(the writer's limit: {DEFAULT_QPS:g}/s, bursts of {DEFAULT_BURST})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
