"""The condition writer under an API server that throttles: order, fairness, rate.

The fake Kubernetes API server (in this process) holds ``--nodes`` GPU Nodes; the
controller's real condition writer (8 workers, the real API client) is told that every
node has failed, all at once: a cluster-wide fault. Run twice in the same process:

- **baseline**: the server takes every write: how fast the writer can go here;
- **throttled**: the server takes ``--rate`` status writes a second and answers the
  rest 429 with Retry-After: 1, as priority and fairness does to a flow over its share.

Printed for each: the time until every node carries its False (against the ideal,
nodes / rate, when throttled), each node's wait from the fault to its write (p50, p99,
max), how far the order of writes strays from the order the nodes failed in (the
largest displacement, in places: 0 is first come, first written), the most times any
one node was written (1: none twice while another waited), the 429s answered.

Run: ``.venv/bin/python -m bench.scenarios.throttling [--nodes 2000] [--rate 100]``
(about 30 s at the defaults). 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.figures.results import check_writable, write_json
from capwatch.controller.conditions import (
    AgentLink,
    Condition,
    ConditionReason,
    ConditionStatus,
    NodeObservation,
)
from capwatch.controller.kube import KubeApi
from capwatch.controller.tracking import NodeState
from capwatch.controller.writes.recorder import EventRecorder
from capwatch.controller.writes.writer import ConditionWriter
from capwatch.kit.clock import SystemClock
from tests.controller.fakes import FakeEventApi, ManualFence
from tests.controller.writing_rig import Observer
from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.kube.rawapi import client_for

FENCE_S = 3600.0  # one replica, always leading: the fence never closes here
LIMIT_S = 600.0  # a run that has not written every node by then has failed


def _failed(node: str) -> NodeState:
    return NodeState(
        observation=NodeObservation(node=node, link=AgentLink.CONNECTED),
        condition=Condition(
            status=ConditionStatus.FALSE,
            reason=ConditionReason.CAP_WRITE_FAILED,
            message="GPU 0: cap write failed",
        ),
        cycle_end_at=None,
    )


async def one_run(nodes: int, rate: int | None) -> dict[str, Any]:
    server = FakeKubeApiServer(history_limit=4 * nodes)
    names = [f"gpu-{i:05}" for i in range(nodes)]
    for name in names:
        server.add_node(name, labels={"nvidia.com/gpu.present": "true"})
    server.start()
    if rate is not None:
        server.throttle("node_status", rate, retry_after=1)
    client = client_for(server, user_agent="capwatch-controller/bench")
    api = KubeApi(client, namespace="bench", identity="bench")
    clock, counted = SystemClock(), Observer()
    fence = ManualFence(FENCE_S, clock=clock)
    writer = ConditionWriter(
        api=api,
        events=EventRecorder(api=FakeEventApi(), fence=fence, clock=clock),
        fence=fence,
        clock=clock,
        observer=counted,
    )
    writer.start()
    try:
        start = time.monotonic()
        for name in names:
            writer.node_changed(_failed(name))
        while counted.count("ok") < nodes:
            if time.monotonic() - start > LIMIT_S:
                raise SystemExit(f"not every node written within {LIMIT_S:.0f} s")
            await asyncio.sleep(0.1)
        took = time.monotonic() - start
    finally:
        await writer.stop()
        api.close()
        server.stop()
    writes = server.node_status_writes()
    order = [w.node for w in writes]
    waits = sorted(w.at - start for w in writes)
    place = {name: k for k, name in enumerate(names)}
    return {
        "nodes": nodes,
        "rate": rate,
        "all_written_s": round(took, 2),
        "ideal_s": None if rate is None else round(nodes / rate, 2),
        "wait_p50_s": round(statistics.median(waits), 2),
        "wait_p99_s": round(waits[max(0, math.ceil(0.99 * len(waits)) - 1)], 2),
        "wait_max_s": round(waits[-1], 2),
        "largest_displacement": max(abs(place[n] - k) for k, n in enumerate(order)),
        "most_writes_of_one_node": max(Counter(order).values()),
        "answered_429": counted.count("throttled"),
    }


def report(figures: dict[str, Any]) -> list[str]:
    lines = []
    for name in ("baseline", "throttled"):
        f = figures[name]
        limit = "no throttle" if f["rate"] is None else f"{f['rate']} writes/s"
        ideal = "" if f["ideal_s"] is None else f" (ideal {f['ideal_s']:.1f} s)"
        lines.append(
            f"  {name} ({limit}): all {f['nodes']} written in {f['all_written_s']:.1f} s"
            f"{ideal}; wait p50 / p99 / max {f['wait_p50_s']:.1f} / {f['wait_p99_s']:.1f} / "
            f"{f['wait_max_s']:.1f} s; order strays by at most {f['largest_displacement']} "
            f"places; a node written at most {f['most_writes_of_one_node']}x; "
            f"{f['answered_429']} answered 429"
        )
    throttled, baseline = figures["throttled"], figures["baseline"]
    lines.append(
        f"  throttled / ideal: {throttled['all_written_s'] / throttled['ideal_s']:.2f}x; "
        f"throttled / baseline: {throttled['all_written_s'] / baseline['all_written_s']:.1f}x"
    )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--rate", type=int, default=100, help="status writes a second taken")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.nodes < 1 or args.rate < 1:
        parser.error("--nodes and --rate: at least 1")
    check_writable(args.json)
    print(f"capwatch condition writer under throttling: {args.nodes} nodes fail at once")
    figures = {
        "baseline": asyncio.run(one_run(args.nodes, None)),
        "throttled": asyncio.run(one_run(args.nodes, args.rate)),
    }
    for line in report(figures):
        print(line)
    if args.json is not None:
        write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
