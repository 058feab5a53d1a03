"""A simulated cluster of 5,000 nodes x 8 GPUs, and the controller(s) following it.

Processes, all real: ``capwatch pool`` x ``--pools`` holding the nodes (15 s
interval, cycles staggered), the fake Kubernetes API server with the GPU
nodes (bench/rigs/apiserver.py), and ``capwatch controller`` (``--shards``
of them, one per shard) following every node through static discovery (the
pools write the targets file) and writing conditions to the API server.
Early in the run a fraction of the nodes start failing their cap writes for
a while (the pools' fault schedule); the bench measures, each figure beside
its target:

- time until every stream is subscribed (<= 30 s);
- controller CPU (cores) and RSS in steady state (<= 0.25 core, <= 512 MiB), per shard;
- detection latency, from the failed cycle's end (the pool's record, on
  CLOCK_MONOTONIC, one clock for every process here) to the PATCH received by
  the API server, p50/p99 (p99 <= 2 s); and back to True;
- API writes per second in steady state (<= nodes/300 plus transitions);
- the cluster stream's fan-out to 10 subscribers: update received, from the
  failed cycle's end, p50/p99;
- with shards: every node followed by exactly one shard, and the fraction of
  nodes that move when going from 2 to 3 shards.

The processes are bench/rigs/sim_cluster.py's. ``--json FILE`` writes the figures for
the charts too: this run's replace those of the same ``--shards`` and shape in FILE, and
those of the others stay (a FILE of another ``--nodes``, or not one of these, is refused
before the run).

    .venv/bin/python -m bench.scenarios.cluster [--nodes 5000] [--shards 1] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from bench.figures.results import earlier_cluster_runs, write_cluster_runs
from bench.rigs.sim_cluster import (
    PREFIX,
    Run,
    api_writes,
    connected,
    kubeconfig,
    shape,
    start_api,
    start_controllers,
    start_pools,
)
from bench.shared.addresses import MAX_NODES
from bench.shared.procs import cpu_seconds, rss_mib
from bench.shared.run import this_run
from bench.shared.stats import percentile, verdict
from capwatch.agent.sim.poolspec import node_names
from capwatch.api.gen.capwatch.v1 import cluster_health_pb2 as cpb
from capwatch.api.gen.capwatch.v1 import cluster_health_pb2_grpc as cpb_grpc
from capwatch.controller.sharding import shard_of

SUBSCRIBERS = 10
_STATUS = {
    cpb.CONDITION_STATUS_TRUE: "True",
    cpb.CONDITION_STATUS_FALSE: "False",
    cpb.CONDITION_STATUS_UNKNOWN: "Unknown",
}


async def subscribe(
    address: str, received: list[tuple[str, str, float]], ready: asyncio.Event
) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        call = cpb_grpc.ClusterHealthServiceStub(channel).Watch(
            cpb.ClusterHealthServiceWatchRequest()
        )
        async for message in call:
            now = time.monotonic()
            if message.HasField("snapshot"):
                if not message.snapshot.more:  # the last page
                    ready.set()
            elif message.HasField("update"):
                node = message.update.node
                status = _STATUS.get(node.condition.status, "?")
                received.append((node.node_name, status, now))


def failures(run: Run) -> dict[str, tuple[float, float | None]]:
    """Per node hit by the fault: (its first failed cycle's end, its first good one after)."""
    out: dict[str, tuple[float, float | None]] = {}
    for path in run.transitions:
        for line in path.read_text().splitlines():
            t = json.loads(line)
            node, at = t["node"], t["finished_monotonic"]
            if not t["enforced"] and node not in out:
                out[node] = (at, None)
            elif t["enforced"] and node in out and out[node][1] is None:
                out[node] = (out[node][0], at)
    return out


def latencies(
    failed: dict[str, tuple[float, float | None]], seen: list[tuple[str, str, float]]
) -> tuple[list[float], list[float]]:
    """(to False, back to True): from each cycle's end to the first sighting after it."""
    by_node: dict[str, list[tuple[str, float]]] = {}
    for node, status, at in seen:
        by_node.setdefault(node, []).append((status, at))
    down, up = [], []
    for node, (fail_at, ok_at) in failed.items():
        sightings = by_node.get(node, [])
        hits = [at for status, at in sightings if status == "False" and at >= fail_at]
        if hits:
            down.append(min(hits) - fail_at)
        backs = [at for status, at in sightings if status == "True" and ok_at and at >= ok_at]
        if backs and ok_at is not None:
            up.append(min(backs) - ok_at)
    return down, up


SHAPE = {"label": "one address per node"}  # set from the arguments; in every figure's line


def line(what: str, value: str, target: str, met: bool | None) -> None:
    judged = "" if met is None else verdict(met)
    print(f"  {what:<54} {value:>22}   target {target:<20} {judged}  [{SHAPE['label']}]")


@dataclass
class Steady:
    window_s: float
    cpu: dict[int, float]
    rss: dict[int, float]
    writes_per_s: float


def accepts(address: tuple[str, int]) -> bool:
    """Whether something listens at ``address`` (a pool's listener is up)."""
    with contextlib.suppress(OSError), socket.create_connection(address, timeout=1):
        return True
    return False


async def start(run: Run) -> float:
    """The API server, the pools, then the controllers; returns when the pools were ready."""
    a = run.args
    started = time.monotonic()
    config = run.work / "kubeconfig"
    kubeconfig(start_api(run), config)
    targets = start_pools(run)
    deadline = time.monotonic() + 120
    while not all(t.exists() and t.read_text().count("\n") for t in targets) or not all(
        accepts(probe) for probe in run.probes
    ):
        for k, proc in enumerate(run.procs):
            if proc.poll() is not None:
                lines = (run.work / f"pool-{k}.log").read_text(errors="replace").splitlines()
                raise SystemExit(f"pool {k} exited: {lines[-1] if lines else 'no output'}")
        if time.monotonic() > deadline:
            raise SystemExit("the pools did not start within 120 s")
        await asyncio.sleep(0.2)
    ready = time.monotonic()
    merged = run.work / "targets.txt"
    merged.write_text("".join(t.read_text() for t in targets))
    print(
        f"{a.nodes} nodes x {a.gpus} GPUs in {len(targets)} pools, {a.interval:g} s interval, "
        f"ready {ready - started:.1f} s after start; {a.shards} controller shard(s); "
        f"shape: {shape(a)}"
    )
    start_controllers(run, merged, config)
    return ready


async def subscribed(run: Run) -> float:
    """Seconds from launching the controllers until every stream is connected."""
    launched = time.monotonic()
    while (count := sum(connected(c.metrics_port) for c in run.controllers)) < run.args.nodes:
        if time.monotonic() - launched > 120 or any(
            c.proc.poll() is not None for c in run.controllers
        ):
            raise SystemExit(f"not subscribed: {count} of {run.args.nodes}")
        await asyncio.sleep(0.25)
    return time.monotonic() - launched


async def initial_writes(run: Run) -> None:
    """The first write of every node (True) is a burst; steady state starts after it."""
    deadline = time.monotonic() + 180
    while len(api_writes(run)) < run.args.nodes:
        if time.monotonic() > deadline:
            raise SystemExit("the initial condition writes did not finish")
        await asyncio.sleep(1)
    await asyncio.sleep(5)


async def steady(run: Run, *, until: float) -> Steady:
    start_at = time.monotonic()
    cpu0 = {c.shard: cpu_seconds(c.proc.pid) for c in run.controllers}
    end = min(start_at + run.args.steady, until)
    if end - start_at < 20:
        print("  (steady window cut short by the fault schedule: raise --fail-at)")
        end = max(end, start_at + 10)
    rss: dict[int, list[float]] = {c.shard: [] for c in run.controllers}
    while time.monotonic() < end:
        for c in run.controllers:
            rss[c.shard].append(rss_mib(c.proc.pid))
        await asyncio.sleep(1)
    window = time.monotonic() - start_at
    writes = sum(1 for w in api_writes(run) if start_at <= float(w["at"]) < start_at + window)  # type: ignore[arg-type]
    return Steady(
        window_s=window,
        cpu={c.shard: (cpu_seconds(c.proc.pid) - cpu0[c.shard]) / window for c in run.controllers},
        rss={shard: max(samples, default=float("nan")) for shard, samples in rss.items()},
        writes_per_s=writes / window,
    )


async def ownership(run: Run) -> dict[str, int]:
    """How many shards follow each node, from each controller's cluster snapshot."""
    owned: dict[str, int] = {}
    for c in run.controllers:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{c.grpc_port}") as channel:
            stub = cpb_grpc.ClusterHealthServiceStub(channel)
            token = ""
            while True:
                page = await stub.GetClusterSnapshot(
                    cpb.GetClusterSnapshotRequest(page_token=token)
                )
                for n in page.snapshot.nodes:
                    owned[n.node_name] = owned.get(n.node_name, 0) + 1
                token = page.next_page_token
                if not token:
                    break
    return owned


async def measure(run: Run) -> dict[str, Any]:
    a = run.args
    pools_ready = await start(run)
    took = await subscribed(run)
    received: list[list[tuple[str, str, float]]] = [[] for _ in range(SUBSCRIBERS)]
    tasks = []
    for k in range(SUBSCRIBERS):
        controller = run.controllers[k % len(run.controllers)]
        ready = asyncio.Event()
        address = f"127.0.0.1:{controller.grpc_port}"
        tasks.append(asyncio.create_task(subscribe(address, received[k], ready)))
        await asyncio.wait_for(ready.wait(), 30)
    await initial_writes(run)
    # The pools started about when their targets files appeared.
    calm = await steady(run, until=pools_ready + a.fail_at - 3.0)
    # The fault window and the recovery, and a few seconds for the last writes.
    await asyncio.sleep(
        max(0.0, pools_ready + a.fail_at + a.fail_for + 3 * a.interval + 5 - time.monotonic())
    )
    for task in tasks:
        task.cancel()
    owned = await ownership(run) if a.shards > 1 else {}
    return report(run, took=took, calm=calm, received=received, owned=owned)


def report(
    run: Run,
    *,
    took: float,
    calm: Steady,
    received: list[list[tuple[str, str, float]]],
    owned: dict[str, int],
) -> dict[str, Any]:
    """Print the figures beside their targets; return them for --json."""
    a = run.args
    failed = failures(run)
    writes = api_writes(run)
    patched = [(str(w["node"]), str(w["status"]), float(w["at"])) for w in writes]  # type: ignore[arg-type]
    down, up = latencies(failed, patched)
    fan = [d for seen in received for d in latencies(failed, seen)[0]]
    # Subscriber k follows shard k % shards: it sees the failing nodes of that shard only.
    expected = sum(
        1
        for k in range(len(received))
        for node in failed
        if shard_of(node, a.shards) == run.controllers[k % len(run.controllers)].shard
    )
    names = node_names(a.nodes, prefix=PREFIX)
    shares = {
        c.shard: sum(1 for n in names if shard_of(n, a.shards) == c.shard) for c in run.controllers
    }
    print("results")
    line("all streams subscribed", f"{took:.1f} s", "<= 30 s", took <= 30)
    for c in run.controllers:
        tag = f"shard {c.shard} ({shares[c.shard]} nodes)"
        line(
            f"controller CPU, steady, {tag}",
            f"{calm.cpu[c.shard]:.3f} cores",
            "<= 0.25 core",
            calm.cpu[c.shard] <= 0.25,
        )
        line(
            f"controller RSS, steady, {tag}",
            f"{calm.rss[c.shard]:.0f} MiB",
            "<= 512 MiB",
            calm.rss[c.shard] <= 512,
        )
        line(
            f"  RSS per followed node, {tag}",
            f"{1024 * calm.rss[c.shard] / max(1, shares[c.shard]):.0f} KiB",
            "-",
            None,
        )
    budget = a.nodes / a.heartbeat
    line(
        f"API writes/s, {calm.window_s:.0f} s of steady state",
        f"{calm.writes_per_s:.2f}/s",
        f"<= {budget:.1f}/s + transitions",
        calm.writes_per_s <= budget,
    )
    line(f"nodes failing (of {a.nodes})", f"{len(failed)}", f"about {a.fail_fraction:.0%}", None)
    line(
        "detection: failed cycle end -> PATCH False, p50",
        f"{percentile(down, 50) * 1000:.0f} ms",
        "-",
        None,
    )
    p99 = percentile(down, 99)
    line(
        "detection: failed cycle end -> PATCH False, p99",
        f"{p99 * 1000:.0f} ms",
        "<= 2000 ms",
        bool(down) and p99 <= 2.0,
    )
    line("  detected / failing", f"{len(down)}/{len(failed)}", "all", len(down) == len(failed))
    line(
        "recovery: good cycle end -> PATCH True, p50 / p99",
        f"{percentile(up, 50) * 1000:.0f} / {percentile(up, 99) * 1000:.0f} ms",
        "-",
        None,
    )
    line(
        f"cluster stream, {SUBSCRIBERS} subscribers: cycle end -> update, p50",
        f"{percentile(fan, 50) * 1000:.0f} ms",
        "-",
        None,
    )
    line(
        f"cluster stream, {SUBSCRIBERS} subscribers: cycle end -> update, p99",
        f"{percentile(fan, 99) * 1000:.0f} ms",
        "-",
        None,
    )
    line(
        "  updates seen / expected",
        f"{len(fan)}/{expected}",
        "all",
        len(fan) == expected,
    )
    strangers = sum(1 for w in writes if "bench-controller-" not in str(w["user_agent"]))
    line("writes from anyone but a controller", f"{strangers}", "0", strangers == 0)
    if owned:
        once = sum(1 for v in owned.values() if v == 1)
        line(
            "nodes followed by exactly one shard",
            f"{once}/{a.nodes}",
            "all",
            once == a.nodes == len(owned),
        )
    moved = sum(1 for n in names if shard_of(n, 2) != shard_of(n, 3)) / len(names)
    line(
        "nodes that move when 2 shards become 3",
        f"{moved:.3f}",
        "about 1/3",
        abs(moved - 1 / 3) < 0.05,
    )

    def ms(values: list[float]) -> dict[str, float | None]:  # None: nothing to measure
        return {
            q: round(percentile(values, n) * 1000, 1) if values else None
            for q, n in (("p50", 50), ("p99", 99))
        }

    return {
        "shards": a.shards,
        "shape": "shared" if a.shared_addresses else "per_node",
        "subscribed_s": round(took, 2),
        "controllers": [
            {
                "shard": c.shard,
                "nodes": shares[c.shard],
                "cores": round(calm.cpu[c.shard], 4),
                "rss_mib": round(calm.rss[c.shard], 1),
            }
            for c in run.controllers
        ],
        "steady_s": round(calm.window_s, 1),
        "writes_per_s": round(calm.writes_per_s, 3),
        "failing": len(failed),
        "detected": len(down),
        "latency_ms": {"to_false": ms(down), "to_true": ms(up), "stream": ms(fan)},
        "updates": {"seen": len(fan), "expected": expected},
        "strangers": strangers,
        "followed_once": sum(1 for v in owned.values() if v == 1) if owned else None,
        "moved_2_to_3": round(moved, 4),
    }


def main(*, description: str = __doc__ or "", nodes: int = 5000, fail_at: float = 120.0) -> int:
    parser = argparse.ArgumentParser(description=description.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--nodes", type=int, default=nodes)
    parser.add_argument("--pools", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--interval", type=float, default=15.0)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--heartbeat", type=float, default=300.0, help="--condition-heartbeat")
    parser.add_argument(
        "--steady", type=float, default=45.0, help="seconds of steady state to measure"
    )
    parser.add_argument("--fail-fraction", type=float, default=0.02)
    parser.add_argument("--fail-at", type=float, default=fail_at, help="s after the pools start")
    parser.add_argument("--fail-for", type=float, default=30.0)
    parser.add_argument("--keep", type=Path, help="keep the logs and records in this directory")
    parser.add_argument(
        "--shared-addresses",
        action="store_true",
        help="every node of a pool behind the pool's one address (not a real cluster's "
        "shape: the controller's connections are shared); default: an address per node",
    )
    parser.add_argument(
        "--json",
        type=Path,
        help="also write the figures here (for the charts), beside those of other --shards",
    )
    args = parser.parse_args()
    if not args.shared_addresses and args.nodes > MAX_NODES:
        parser.error(f"--nodes {args.nodes}: one address per node holds {MAX_NODES} at most")
    SHAPE["label"] = shape(args)
    # Refused now, not after the run: a file that cannot take this run's figures.
    earlier = earlier_cluster_runs(
        args.json, args.nodes, args.shards, "shared" if args.shared_addresses else "per_node"
    )
    with tempfile.TemporaryDirectory(prefix="capwatch-cluster-bench-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        run = Run(args=args, work=work)
        try:
            figures = asyncio.run(measure(run))
        finally:
            run.stop()
    if args.json is not None:
        write_cluster_runs(args.json, args.nodes, [*earlier, {"source": this_run(), **figures}])
    return 0


if __name__ == "__main__":
    sys.exit(main())
