"""Agent-side cost of one reconcile cycle: 8 GPUs, 110 pods, 64 processes.

The GPU backend is the simulator (zero latency), the pod view is the real
Kubernetes list+watch cache driven by the real client against the in-process
fake API server, and attribution reads real cgroup files from a materialised
proc tree. So the figure is what the agent itself spends per cycle.

Printed, all measured in this run:
* median and p99 ms per cycle (target: median <= 2 ms on the 2-core CI machine);
* the same cycle with an in-memory pod view, as the floor (ratio);
* a naive LIST of this node's pods, which an agent without a watch cache
  would pay every cycle (ratio);
* API requests per cycle in steady state (target: 0 LIST).

Run: ``make bench`` (or ``PYTHONPATH=. .venv/bin/python bench/cycle.py``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import kubernetes.client

from agent.attribution import Attributor, FsProcRoot
from agent.kube.client import KubernetesPodView
from agent.kube.informer import WatchPolicy
from agent.ownership import OwnershipStore
from agent.pods import PodInfo, PodRef, PodView
from agent.reconciling import Policy, Reconciler
from agent.sim.scenario import parse_scenario
from agent.sim.views import SimGpuBackend
from agent.sim.world import SimWorld
from bench.figures import check_writable, write_json
from kit.clock import SystemClock
from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.fakes.pods import StaticPodView

NODE = "bench-node"
KEY = "capwatch.io/gpu-power-limit"
GPUS, PODS, PROCESSES = 8, 110, 64


def pod_uid(i: int) -> str:
    return f"bbbbbbbb-0000-4000-8000-{i:012d}"


def annotations(i: int) -> dict[str, str]:
    # A realistic mix: most annotated, some not, a few invalid.
    if i % 10 == 9:
        return {}
    if i % 17 == 0:
        return {KEY: "lots"}
    return {KEY: str(300 + (i % 8) * 25)}


def build_world(proc_root: Path) -> SimWorld:
    processes = [
        # 64 processes on 8 GPUs, 8 per GPU, each GPU shared by 2 pods.
        {"gpu": p % GPUS, "pid": 10_000 + p, "pod": pod_uid((p % GPUS) * 2 + (p // GPUS) % 2)}
        for p in range(PROCESSES)
    ]
    scenario = parse_scenario(
        {
            "node_name": NODE,
            "safe_default_watts": 300,
            "gpus": [
                {
                    "uuid": f"GPU-bbbbbbbb-0000-4000-8000-{i:012d}",
                    "min_watts": 200,
                    "max_watts": 700,
                    "default_watts": 700,
                }
                for i in range(GPUS)
            ],
            "pods": [
                {
                    "namespace": "bench",
                    "name": f"p{i}",
                    "uid": pod_uid(i),
                    "annotations": annotations(i),
                }
                for i in range(PODS)
            ],
            "processes": processes,
        },
        source="bench",
    )
    world = SimWorld(scenario)
    world.materialise_procs(proc_root)
    return world


def reconciler_for(world: SimWorld, pods: PodView, proc_root: Path, state: Path) -> Reconciler:
    clock = SystemClock()
    return Reconciler(
        backend=SimGpuBackend(world),
        pods=pods,
        attributor=Attributor(FsProcRoot(proc_root)),
        store=OwnershipStore(state, clock=clock),
        clock=clock,
        policy=Policy(annotation_key=KEY, safe_default_watts=300),
        initial_device_count=GPUS,
        listeners=(world,),
    )


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


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98]


def print_figures(
    cycles: int,
    kube_ms: list[float],
    floor_ms: list[float],
    list_ms: list[float],
    lists: int,
    watches: int,
) -> None:
    med, floor_med, list_med = (statistics.median(s) for s in (kube_ms, floor_ms, list_ms))
    verdict = "met" if med <= 2 else "MISSED"
    print(
        f"capwatch cycle benchmark: {GPUS} GPUs, {PODS} pods, {PROCESSES} processes, "
        f"{cycles} cycles, Python {sys.version.split()[0]}"
    )
    print(
        f"  cycle (kubernetes list+watch view): median {med:.3f} ms  p99 {p99(kube_ms):.3f} ms"
        f"  [target median <= 2 ms: {verdict}]"
    )
    print(
        f"  cycle (in-memory pod view, floor):  median {floor_med:.3f} ms  "
        f"p99 {p99(floor_ms):.3f} ms  ratio {med / floor_med:.2f}x"
    )
    print(
        f"  naive LIST of this node's pods:      median {list_med:.3f} ms  "
        f"({list_med / med:.1f}x a whole cycle; paid every cycle without a watch cache)"
    )
    print(
        f"  API requests per cycle in steady state: LIST {lists / cycles:.3f}  "
        f"WATCH {watches / cycles:.3f}  [target 0 LIST: {'met' if lists == 0 else 'MISSED'}]"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--json", type=Path, help="also write every cycle's time here")
    args = parser.parse_args()
    check_writable(args.json)

    server = FakeKubeApiServer()
    server.start()
    for i in range(PODS):
        server.add_pod("bench", f"p{i}", node=NODE, uid=pod_uid(i), annotations=annotations(i))
    for i in range(200):  # pods on other nodes, which the field selector must keep out
        server.add_pod("other", f"q{i}", node=f"node-{i % 7}")
    config = kubernetes.client.Configuration(host=server.url)
    config.retries = False
    api = kubernetes.client.ApiClient(config)
    view = KubernetesPodView(
        node_name=NODE, api_client=api, clock=SystemClock(), policy=WatchPolicy(stale_after=15)
    )
    view.start()
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                assert len(view.snapshot().pods) == PODS
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            world = build_world(root / "proc")
            kube = reconciler_for(world, view, root / "proc", root / "state-kube")
            lists_before = server.count("list")
            watches_before = server.count("watch")
            kube_ms = time_cycles(kube, args.cycles)
            lists = server.count("list") - lists_before
            watches = server.count("watch") - watches_before

            memory_view = StaticPodView(
                PodInfo(
                    ref=PodRef(namespace="bench", name=f"p{i}", uid=pod_uid(i)),
                    annotations=annotations(i),
                )
                for i in range(PODS)
            )
            floor = reconciler_for(world, memory_view, root / "proc", root / "state-mem")
            floor_ms = time_cycles(floor, args.cycles)

        core = kubernetes.client.CoreV1Api(api)
        list_ms = []
        for _ in range(50):
            start = time.perf_counter()
            core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE}")
            list_ms.append((time.perf_counter() - start) * 1000)
    finally:
        view.close()
        api.close()
        server.stop()

    print_figures(args.cycles, kube_ms, floor_ms, list_ms, lists, watches)
    if args.json is not None:
        write_json(args.json, cycle_figures(kube_ms, floor_ms))
    return 0


def cycle_figures(kube_ms: list[float], floor_ms: list[float]) -> dict[str, object]:
    """Every cycle's time, for bench/plot.py's distribution."""
    return {
        "kube_ms": [round(ms, 4) for ms in kube_ms],
        "floor_ms": [round(ms, 4) for ms in floor_ms],
    }


if __name__ == "__main__":
    sys.exit(main())
