"""Where the controller's memory goes at N nodes: its heap by owner and by type.

bench/scenarios/cluster.py's cluster (the fake API server, ``capwatch pool`` processes,
one loopback address per node, no faults) and one ``capwatch controller`` started under
bench/rigs/heap_profiled.py. Once every stream is subscribed, every node's first condition
written and ``--settle`` seconds passed, the controller is asked (SIGUSR1) where its
heap is. Printed: the resident set split into what Python allocated (traced) and the
rest (grpc core's connections, C libraries, allocator slack), each per node, then the
top owners (the capwatch module nearest each allocation) and the top container types.

Tracing costs time and memory of its own: the shape of the heap is what this gives;
the controller's figures come from bench/scenarios/cluster.py and kwok.py.

Run: ``.venv/bin/python -m bench.scenarios.heap [--nodes 5000] [--json FILE]``
(about three minutes at 5,000). Every process it starts it stops; 127.0.0.0/8 only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.figures.results import check_writable, write_json
from bench.rigs.sim_cluster import Run
from bench.scenarios.cluster import initial_writes, start, subscribed
from bench.shared.addresses import MAX_NODES
from bench.shared.procs import rss_mib

PROFILE_WAIT_S = 300.0


def cluster_args(nodes: int) -> argparse.Namespace:
    """bench/scenarios/cluster.py's arguments for one shard, an address per node, no faults."""
    return argparse.Namespace(
        nodes=nodes,
        pools=4,
        gpus=8,
        interval=15.0,
        shards=1,
        heartbeat=300.0,
        steady=0.0,
        # The pools take a fault schedule; this one starts after the run has ended.
        fail_fraction=0.01,
        fail_at=86_400.0,
        fail_for=1.0,
        keep=None,
        shared_addresses=False,
        json=None,
    )


async def settled(run: Run, settle_s: float) -> float:
    """The cluster up, every stream subscribed and first condition written, settled: the
    seconds it took to subscribe."""
    await start(run)
    took = await subscribed(run)
    await initial_writes(run)
    await asyncio.sleep(settle_s)
    return took


def profiled(run: Run, out: Path) -> dict[str, Any]:
    """Ask the controller where its heap is, and wait for the answer."""
    (controller,) = run.controllers
    rss = rss_mib(controller.proc.pid)
    controller.proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + PROFILE_WAIT_S
    while not out.exists():
        if time.monotonic() > deadline or controller.proc.poll() is not None:
            raise SystemExit("the controller wrote no heap profile")
        time.sleep(1)
    found: dict[str, Any] = json.loads(out.read_text())
    return {"rss_before_profile_mib": round(rss, 1), **found}


def report(nodes: int, figures: dict[str, Any]) -> list[str]:
    rss, traced = figures["rss_mib"], figures["traced_mib"]
    per_node = 1024 / nodes
    lines = [
        f"  controller RSS {rss:.0f} MiB ({rss * per_node:.1f} KiB a node); "
        f"{figures['rss_before_profile_mib']:.0f} MiB before the profile was taken",
        f"  Python's own allocations (traced): {traced:.0f} MiB ({traced * per_node:.1f} KiB a "
        f"node); the rest, grpc core, C libraries and allocator slack: {rss - traced:.0f} MiB "
        f"({(rss - traced) * per_node:.1f} KiB a node)",
        "  by owner (the capwatch module nearest the allocation):",
    ]
    lines += [
        f"    {o['mib']:8.1f} MiB  {o['mib'] * per_node:6.2f} KiB/node  {o['file']}"
        for o in figures["owners"][:15]
    ]
    lines.append("  by type (containers the garbage collector tracks; shallow sizes):")
    lines += [
        f"    {t['mib']:8.1f} MiB  {t['count']:>9,}  {t['type']}" for t in figures["types"][:15]
    ]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--settle", type=float, default=30.0, help="seconds after the writes")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if not 1 <= args.nodes <= MAX_NODES:
        parser.error(f"--nodes: 1 to {MAX_NODES} (one loopback /24 per node)")
    check_writable(args.json)
    print(f"capwatch controller heap: {args.nodes} nodes, an address each")
    with tempfile.TemporaryDirectory(prefix="capwatch-heap-") as tmp:
        work = Path(tmp)
        out = work / "heap.json"
        launcher = (
            sys.executable,
            "-m",
            "bench.rigs.heap_profiled",
            str(out),
            "-m",
            "capwatch.cli",
        )
        run = Run(args=cluster_args(args.nodes), work=work, launcher=launcher)
        try:
            took = asyncio.run(settled(run, args.settle))
            figures = {"subscribe_s": round(took, 1), **profiled(run, out)}
        finally:
            run.stop()
    for line in report(args.nodes, figures):
        print(line)
    if args.json is not None:
        write_json(args.json, {"nodes": args.nodes, **figures})
    return 0


if __name__ == "__main__":
    sys.exit(main())
