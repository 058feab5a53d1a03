"""5,000 nodes in a real cluster's shape: KWOK, the real control plane, a pod IP per node.

The sibling of bench/scenarios/cluster.py on the real API server (bench/rigs/kwok_cluster.py
on tests/realkube/kwok_cluster.py):
kube-apiserver, etcd, kube-controller-manager, kube-scheduler and KWOK; N GPU nodes,
each with a loopback /24 as its podCIDR; the chart installed by helm (its DaemonSet
scheduled by the real controllers: an agent pod Running at a loopback IP of each node's
own); ``capwatch pool`` x ``--pools`` answering at those IPs (15 s interval, 8 GPUs);
``capwatch controller`` as the StatefulSet's pod 0 (pod-bound token, the chart's RBAC
and fencing policy), discovering the agent pods and dialling each pod IP: one
connection per node. A fraction of the nodes fail their cap writes for a while. Each
figure beside its target:

- time until every stream is subscribed (<= 30 s);
- controller CPU and RSS in steady state (<= 0.25 core, <= 512 MiB), and the RSS of a
  bare grpc.aio client holding the same connections and streams (the floor,
  bench/floors/watch_client.py), measured in the same run, with the ratio;
- detection and recovery latency, from the failed (or good) cycle's end (the pool's
  record) to the condition arriving at a plain Node watcher, p50/p99 (p99 <= 2 s);
- condition writes per second, the API server's own count, and the server-side
  latency of those PATCHes (apiserver_request_duration_seconds, p50/p99);
- kube-apiserver, etcd and KWOK CPU and RSS;
- the bytes a plain Node watcher receives per condition write and per heartbeat round;
- writes refused (403), which with one replica must be none.

Then the controller is restarted with a 60 s heartbeat and the steady figures are
taken again, so both heartbeats are measured on the same cluster.

With ``--shards S`` the chart's controller has S shards and every replica runs (one
per shard, each with its pod-bound token): each replica's CPU and RSS is reported, the
floor is shard 0's streams.

    .venv/bin/python -m bench.scenarios.kwok [--nodes 5000] [--shards 1] [--json FILE]
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.figures.results import held_runs, write_kwok_runs
from bench.rigs.kwok_cluster import (
    AGENTS,
    NAMESPACE,
    PREFIX,
    Cluster,
    apiserver_metrics,
    patch_latency_buckets,
    quantile,
    status_patches,
    usage,
    watched,
)
from bench.rigs.sim_cluster import Run, connected
from bench.scenarios.cluster import failures, line
from bench.shared.run import this_run
from bench.shared.stats import percentile
from capwatch.controller.sharding import shard_of
from tests.chart.support import Helm, fetch_helm
from tests.realkube.controlplane import build_kube
from tests.realkube.kwok_cluster import KwokNodes, kwok_plane
from tests.realkube.local import flag


def wait(check: Any, timeout: float, what: str, *, poll: float = 2.0) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise SystemExit(f"timed out: {what}")
        time.sleep(poll)
    return time.monotonic() - started


def steady(cluster: Cluster, pids: dict[str, int], watch: Path, window_s: float) -> dict[str, Any]:
    """CPU, RSS, writes, PATCH latency and watcher bytes over ``window_s``."""
    before, metrics0, seen0 = usage(pids), apiserver_metrics(cluster.plane), len(watched(watch))
    started = time.monotonic()
    time.sleep(window_s)
    elapsed = time.monotonic() - started
    after, metrics1, records = usage(pids), apiserver_metrics(cluster.plane), watched(watch)
    ok0, ok1 = status_patches(metrics0).get("200", 0.0), status_patches(metrics1).get("200", 0.0)
    buckets0, buckets1 = patch_latency_buckets(metrics0), patch_latency_buckets(metrics1)
    window = [r for r in records[seen0:] if "node" in r]
    return {
        "window_s": round(elapsed, 1),
        "cores": {n: round((after[n][0] - before[n][0]) / elapsed, 3) for n in pids},
        "rss_mib": {n: round(after[n][1], 1) for n in pids},
        "writes_per_s": round((ok1 - ok0) / elapsed, 2),
        "patch_ms": {
            "p50": round(quantile(buckets1, buckets0, 0.5) * 1000, 1),
            "p99": round(quantile(buckets1, buckets0, 0.99) * 1000, 1),
        },
        "watcher_bytes_per_write": round(sum(r["bytes"] for r in window) / len(window), 0)
        if window
        else None,
    }


def print_steady(label: str, figures: dict[str, Any], nodes: int, heartbeat_s: float) -> None:
    cores, rss = figures["cores"], figures["rss_mib"]
    for name in sorted(n for n in cores if n.startswith("controller")):  # one per shard
        line(f"{name} CPU, steady ({label})", f"{cores[name]:.3f} cores", "<= 0.25 core",
             cores[name] <= 0.25)  # fmt: skip
        line(f"{name} RSS, steady ({label})", f"{rss[name]:.0f} MiB", "<= 512 MiB",
             rss[name] <= 512)  # fmt: skip
    for name in ("kube-apiserver", "etcd", "kwok"):
        line(f"{name} CPU / RSS ({label})", f"{cores[name]:.2f} cores / {rss[name]:.0f} MiB",
             "-", None)  # fmt: skip
    budget = nodes / heartbeat_s
    line(f"condition writes/s ({label})", f"{figures['writes_per_s']:.1f}/s",
         f"~{budget:.1f}/s + transitions", None)  # fmt: skip
    p = figures["patch_ms"]
    line(f"PATCH nodes/status, server side p50 / p99 ({label})", f"{p['p50']} / {p['p99']} ms",
         "-", None)  # fmt: skip
    per_write = figures["watcher_bytes_per_write"]
    if per_write:
        line(f"a Node watcher's bytes per write ({label})", f"{per_write:,.0f} B", "-", None)
        line(f"... per heartbeat round of {nodes} nodes ({label})",
             f"{per_write * nodes / 2**20:.1f} MiB", "-", None)  # fmt: skip


def setup(
    cluster: Cluster, helm: Helm, n: int, shards: int
) -> tuple[KwokNodes, dict[str, str], dict[str, int]]:
    """The nodes, Ready; the chart installed; every agent pod Running: node -> pod IP."""
    plane = cluster.plane
    plane.create_namespace(NAMESPACE)
    began = time.monotonic()
    nodes = KwokNodes.create(plane, PREFIX, n, workers=16)
    created = time.monotonic() - began
    ready = wait(lambda: nodes.ready() == n, 900, "every node Ready")
    one_replica = ("--set", "controller.enabled=true", "--set", "controller.replicasPerShard=1")
    cluster.install(helm, (*one_replica, "--set", f"controller.shards={shards}"))
    running = time.monotonic()
    ips = nodes.wait_pods(NAMESPACE, AGENTS, timeout=1800)
    running = time.monotonic() - running
    print(
        f"{n} KWOK nodes created in {created:.0f} s, Ready {ready:.0f} s later; "
        f"{n} agent pods Running {running:.0f} s after helm install; shape: one pod IP per node",
        flush=True,
    )
    return nodes, ips, {"nodes": round(created), "ready": round(ready), "pods": round(running)}


def detection(
    run: Run, watch: Path, n: int, fraction: float
) -> tuple[int, list[float], list[float]]:
    """Failed (good) cycle end to the watcher's False (True), for each node hit."""
    failed = failures(run)
    seen = [(r["node"], r["status"], r["at"]) for r in watched(watch) if "node" in r]
    down = [_first(seen, node, "False", at) - at for node, (at, _) in failed.items()]
    up = [_first(seen, node, "True", at) - at for node, (_, at) in failed.items() if at]
    down = [d for d in down if not math.isnan(d)]
    up = [u for u in up if not math.isnan(u)]
    line(f"nodes failing (of {n})", f"{len(failed)}", f"about {fraction:.0%}", None)
    p50, p99 = percentile(down, 50) * 1000, percentile(down, 99) * 1000
    met = bool(down) and p99 <= 2000
    line("detection: cycle end -> watcher sees False, p50/p99", f"{p50:.0f} / {p99:.0f} ms",
         "p99 <= 2000 ms", met)  # fmt: skip
    line("  detected / failing", f"{len(down)}/{len(failed)}", "all", len(down) == len(failed))
    u50, u99 = percentile(up, 50) * 1000, percentile(up, 99) * 1000
    line("recovery: cycle end -> watcher sees True, p50/p99", f"{u50:.0f} / {u99:.0f} ms",
         "-", None)  # fmt: skip
    return len(failed), down, up


def measure(cluster: Cluster, helm: Helm, args: argparse.Namespace) -> dict[str, Any]:
    work, n = cluster.work, args.nodes
    nodes, ips, setup_s = setup(cluster, helm, n, args.shards)
    port = int(flag(_controller_args(cluster), "--agent-port"))
    transitions = cluster.pools(nodes.names, ips, port, args, work)
    pools_started = time.monotonic()

    def cycled() -> bool:
        return sum(len(p.read_text().splitlines()) for p in transitions if p.exists()) >= n

    wait(cycled, 300, "every node's first cycle")
    watch = work / "watch.jsonl"
    cluster.watcher(watch)
    wait(lambda: "watching" in (work / "watcher.log").read_text(), 120, "the Node watcher")
    # Every replica of a sharded controller, one per shard, each following its own nodes.
    started = [cluster.controller(args.heartbeat, k) for k in range(args.shards)]
    took = wait(
        lambda: sum(connected(port) for _, port in started) >= n,
        300,
        "every stream subscribed",
        poll=0.25,
    )

    def all_true() -> bool:
        return sum(1 for r in watched(watch) if r.get("status") == "True") >= n

    # Every node's first report is a write, at the API server's pace: about 15 a second
    # on the CI-class machine; 10,000 nodes on two replicas outlasted a fixed 600 s.
    wait(all_true, max(600.0, 0.12 * n), "every node True")
    time.sleep(5)
    pids = {**cluster.component_pids(), **_replicas(started)}
    print("results", flush=True)
    line("all streams subscribed", f"{took:.1f} s", "<= 30 s", took <= 30)
    calm = steady(cluster, pids, watch, args.steady or args.heartbeat)
    print_steady(f"heartbeat {args.heartbeat:g} s", calm, n, args.heartbeat)
    end_of_fault = pools_started + args.fail_at + args.fail_for + 3 * args.interval + 15
    time.sleep(max(0.0, end_of_fault - time.monotonic()))
    run = Run(args=args, work=work, transitions=transitions)
    failing, down, up = detection(run, watch, n, args.fail_fraction)
    refused = status_patches(apiserver_metrics(cluster.plane)).get("403", 0.0)
    line("condition writes refused (403)", f"{refused:.0f}", "0", refused == 0)
    # The floor of replica 0: the streams of shard 0's nodes.
    ours = [name for name in nodes.names if shard_of(name, args.shards) == 0]
    floor_rss = _floor(cluster, ours, ips, port)
    ratio = calm["rss_mib"]["controller"] / floor_rss
    line("floor: bare grpc.aio client, the same streams, RSS", f"{floor_rss:.0f} MiB", "-", None)
    line("controller RSS / floor", f"{ratio:.2f}x", "-", None)
    for pid, _ in started:
        os.kill(pid, signal.SIGTERM)
    time.sleep(3)
    again = [cluster.controller(60.0, k) for k in range(args.shards)]
    wait(
        lambda: sum(connected(port) for _, port in again) >= n,
        300,
        "every stream subscribed (60 s heartbeat)",
    )
    time.sleep(65)  # a full heartbeat round first
    fast = steady(cluster, {**pids, **_replicas(again)}, watch, args.steady or 60.0)
    print_steady("heartbeat 60 s", fast, n, 60.0)
    return {
        "nodes": n,
        "shards": args.shards,
        "shape": "per_node",
        "setup_s": setup_s,
        "subscribed_s": round(took, 2),
        "steady": {f"heartbeat_{args.heartbeat:g}": calm, "heartbeat_60": fast},
        "failing": failing,
        "detected": len(down),
        "latency_ms": {
            "to_false": {"p50": _ms(down, 50), "p99": _ms(down, 99)},
            "to_true": {"p50": _ms(up, 50), "p99": _ms(up, 99)},
        },
        "refused": refused,
        "floor_rss_mib": round(floor_rss, 1),
        "rss_over_floor": round(ratio, 2),
    }


def _replicas(started: list[tuple[int, int]]) -> dict[str, int]:
    """The replicas' pids by name: ``controller`` (shard 0), ``controller-1``, ..."""
    return {
        ("controller" if k == 0 else f"controller-{k}"): pid for k, (pid, _) in enumerate(started)
    }


def _ms(values: list[float], q: float) -> float | None:
    return round(percentile(values, q) * 1000, 1) if values else None


def _controller_args(cluster: Cluster) -> list[str]:
    statefulset = next(o for o in cluster.rendered if o["kind"] == "StatefulSet")
    return list(statefulset["spec"]["template"]["spec"]["containers"][0]["args"])


def _first(seen: list[tuple[str, str, float]], node: str, status: str, after: float) -> float:
    times = [at for name, s, at in seen if name == node and s == status and at >= after]
    return min(times) if times else float("nan")


def _floor(cluster: Cluster, names: list[str], ips: dict[str, str], port: int) -> float:
    targets = cluster.work / "floor-targets.txt"
    targets.write_text("".join(f"{n} {ips[n]}:{port}\n" for n in names))
    pid = cluster.start("floor", [sys.executable, "-m", "bench.floors.watch_client", str(targets)])
    log = cluster.work / "floor.log"
    wait(lambda: log.exists() and "subscribed" in log.read_text(), 300, "the floor client")
    time.sleep(10)
    rss = usage({"floor": pid})["floor"][1]
    os.kill(pid, signal.SIGTERM)
    return rss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pools", type=int, default=4)
    parser.add_argument(
        "--shards", type=int, default=1, help="controller.shards: one replica of each runs"
    )
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--interval", type=float, default=15.0)
    parser.add_argument("--heartbeat", type=float, default=300.0)
    parser.add_argument(
        "--steady", type=float, help="seconds of steady state (default: a heartbeat period)"
    )
    parser.add_argument("--fail-fraction", type=float, default=0.02)
    parser.add_argument("--fail-at", type=float, default=150.0)
    parser.add_argument("--fail-for", type=float, default=30.0)
    parser.add_argument("--keep", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    held = held_runs(args.json, args.nodes, "kwok.py")
    binaries = build_kube().cached_binaries()
    if binaries is None:
        print("kwok bench: the control plane is not built (make kube)", file=sys.stderr)
        return 1
    helm = Helm(binary=fetch_helm(), home=Path(tempfile.mkdtemp(prefix="capwatch-helm-")))
    with tempfile.TemporaryDirectory(prefix="capwatch-kwok-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        with kwok_plane(work / "plane", binaries) as plane:
            cluster = Cluster(plane=plane, work=work)
            try:
                figures = measure(cluster, helm, args)
            finally:
                cluster.stop()
    if args.json is not None:
        write_kwok_runs(args.json, [*held, {"source": this_run(), **figures}])
    return 0


if __name__ == "__main__":
    sys.exit(main())
