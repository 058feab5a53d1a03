"""Agent-side cost of one reconcile cycle: 8 GPUs, 110 pods, 64 processes, 16 claims.

The GPU backend is the simulator (zero latency), the pod view and the claims view
are the real Kubernetes list+watch caches driven by the real client against the
in-process fake API server, and attribution reads real cgroup files from a
materialised proc tree. So the figure is what the agent itself spends per cycle.

The 16 DRA ResourceClaims: 4 allocate GPUs 0-3 of this node with a capwatch.io
PowerCap (each reserved for the two pods sharing its GPU: the claims decide), 4
allocate GPUs 4-7 with no capwatch config (the annotations decide), and 8 are
allocated on other nodes (which the agent never reads: its pods name the claims
it reads, by name, once each).

Printed, all measured in this run:
* median and p99 ms per cycle (target: median <= 2 ms on the 2-core CI machine);
* the same cycle with an in-memory pod view, as the floor (ratio);
* a naive LIST of this node's pods, which an agent without a watch cache
  would pay every cycle (ratio);
* API requests per cycle in steady state, pods and claims (target: 0 LIST).

The node is bench/rigs/node.py's; the floor's views are in memory (bench/floors/views.py).

Run: ``make bench`` (or ``.venv/bin/python -m bench.scenarios.cycle``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import kubernetes.client

from bench.figures.results import check_writable, write_json
from bench.floors.views import FixedClaims
from bench.rigs.node import (
    CLAIMS,
    GPUS,
    NODE,
    PODS,
    PROCESSES,
    build_world,
    memory_pods,
    reconciler_for,
    seeded_server,
)
from bench.shared.stats import p99, verdict
from capwatch.agent.kube.claims import RESOURCE_API, SLICES_PATH, NodeClaims
from capwatch.agent.kube.pod_requests import KubernetesPodRequests
from capwatch.agent.kube.podview import PodInformer
from capwatch.agent.reconciling import Reconciler
from capwatch.kit.clock import SystemClock
from capwatch.kube.access import ClusterAccess
from capwatch.kube.client import CollectionRequests, ObjectRequests, group_version_served
from capwatch.kube.informer import WatchPolicy
from capwatch.kube.transport import ApiTransport


def time_cycles(reconciler: Reconciler, cycles: int) -> list[float]:
    for _ in range(20):  # warm-up: first cycle claims GPUs and writes the record
        assert reconciler.reconcile_once().enforced
    samples = []
    for _ in range(cycles):
        start = time.perf_counter()
        report = reconciler.reconcile_once()
        samples.append((time.perf_counter() - start) * 1000)
        assert report.enforced, report.failure_summary
    return samples


def print_figures(
    cycles: int,
    kube_ms: list[float],
    floor_ms: list[float],
    list_ms: list[float],
    lists: int,
    watches: int,
    claim_requests: int,
) -> None:
    med, floor_med, list_med = (statistics.median(s) for s in (kube_ms, floor_ms, list_ms))
    print(
        f"capwatch cycle benchmark: {GPUS} GPUs, {PODS} pods, {PROCESSES} processes, "
        f"{CLAIMS} claims, {cycles} cycles, Python {sys.version.split()[0]}"
    )
    print(
        f"  cycle (kubernetes list+watch views): median {med:.3f} ms  p99 {p99(kube_ms):.3f} ms"
        f"  [target median <= 2 ms: {verdict(med <= 2)}]"
    )
    print(
        f"  cycle (in-memory views, floor):      median {floor_med:.3f} ms  "
        f"p99 {p99(floor_ms):.3f} ms  ratio {med / floor_med:.2f}x"
    )
    print(
        f"  naive LIST of this node's pods:       median {list_med:.3f} ms  "
        f"({list_med / med:.1f}x a whole cycle; paid every cycle without a watch cache)"
    )
    print(
        f"  API requests per cycle in steady state: LIST {lists / cycles:.3f}  "
        f"WATCH {watches / cycles:.3f}  [target 0 LIST: {verdict(lists == 0)}]"
    )
    print(
        f"  claims and slices requests per cycle in steady state: "
        f"{claim_requests / cycles:.3f}  [target 0: {verdict(claim_requests == 0)}]"
    )


def wait_synced(view: PodInformer, claims: NodeClaims) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            assert len(view.snapshot().pods) == PODS
            assert len(claims.snapshot(view.snapshot()).caps) == 4
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--json", type=Path, help="also write every cycle's time here")
    args = parser.parse_args()
    check_writable(args.json)

    server = seeded_server()
    api = ApiTransport(ClusterAccess(server=server.url), user_agent="bench")
    policy = WatchPolicy(stale_after=15)
    view = PodInformer(
        node_name=NODE,
        requests=KubernetesPodRequests(api, node_name=NODE, namespace=None),
        clock=SystemClock(),
        policy=policy,
    )
    claims = NodeClaims(
        node_name=NODE,
        slices=CollectionRequests(api, path=SLICES_PATH, field_selector=f"spec.nodeName={NODE}"),
        objects=ObjectRequests(api, timeout=5.0),
        served=lambda: group_version_served(api, RESOURCE_API, timeout=5.0),
        clock=SystemClock(),
        policy=policy,
    )
    view.start()
    claims.start()
    try:
        wait_synced(view, claims)
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            world = build_world(root / "proc")
            kube = reconciler_for(world, view, claims, root / "proc", root / "state-kube")
            lists_before = server.count("list")
            watches_before = server.count("watch")
            claim_kinds = ("claim_get", "slice_list", "slice_watch")
            claims_before = sum(server.count(kind) for kind in claim_kinds)
            kube_ms = time_cycles(kube, args.cycles)
            lists = server.count("list") - lists_before
            watches = server.count("watch") - watches_before
            claim_requests = sum(server.count(kind) for kind in claim_kinds) - claims_before

            fixed = FixedClaims(claims.snapshot(view.snapshot()))
            floor = reconciler_for(world, memory_pods(), fixed, root / "proc", root / "state-mem")
            floor_ms = time_cycles(floor, args.cycles)

        # What a LIST a cycle would cost through the typed client library's models.
        config = kubernetes.client.Configuration(host=server.url)
        config.retries = False
        core = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(config))
        list_ms = []
        for _ in range(50):
            start = time.perf_counter()
            core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE}")
            list_ms.append((time.perf_counter() - start) * 1000)
    finally:
        view.close()
        claims.close()
        api.close()
        server.stop()

    print_figures(args.cycles, kube_ms, floor_ms, list_ms, lists, watches, claim_requests)
    if args.json is not None:
        write_json(args.json, cycle_figures(kube_ms, floor_ms))
    return 0


def cycle_figures(kube_ms: list[float], floor_ms: list[float]) -> dict[str, object]:
    """Every cycle's time, for the chart of their distribution (bench/figures)."""
    return {
        "kube_ms": [round(ms, 4) for ms in kube_ms],
        "floor_ms": [round(ms, 4) for ms in floor_ms],
    }


if __name__ == "__main__":
    sys.exit(main())
