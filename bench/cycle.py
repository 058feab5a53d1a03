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

Run: ``make bench`` (or ``PYTHONPATH=. .venv/bin/python bench/cycle.py``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import kubernetes.client

from agent.attribution import Attributor, FsProcRoot
from agent.dra.claims import API_VERSION, DRIVER, KIND, ClaimsSnapshot, ClaimView
from agent.kube.access import ClusterAccess
from agent.kube.claims import RESOURCE_API, SLICES_PATH, NodeClaims
from agent.kube.client import (
    CollectionRequests,
    KubernetesPodRequests,
    ObjectRequests,
    group_version_served,
)
from agent.kube.informer import WatchPolicy
from agent.kube.podview import PodInformer
from agent.kube.transport import ApiTransport
from agent.ownership import OwnershipStore
from agent.pods import PodInfo, PodRef, PodSnapshot, PodView
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
GPUS, PODS, PROCESSES, CLAIMS = 8, 110, 64, 16
GPU_DRIVER = "gpu.nvidia.com"


def gpu_uuid(i: int) -> str:
    return f"GPU-bbbbbbbb-0000-4000-8000-{i:012d}"


def node_slice(node: str, uuids: list[str]) -> dict[str, Any]:
    """A ResourceSlice as NVIDIA's DRA driver publishes one for ``node``."""
    return {
        "metadata": {"name": f"{node}-gpu.nvidia.com"},
        "spec": {
            "driver": GPU_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": f"gpu-{i}", "attributes": {"uuid": {"string": u}, "index": {"int": i}}}
                for i, u in enumerate(uuids)
            ],
        },
    }


def resource_claims() -> list[dict[str, Any]]:
    """The 16 claims of the module docstring, allocated as the scheduler writes them."""
    claims = []
    for i in range(CLAIMS):
        here = i < GPUS
        gpu = i % GPUS
        config = []
        if here and gpu < 4:
            parameters = {"apiVersion": API_VERSION, "kind": KIND, "watts": 400 + gpu * 25}
            config = [{"source": "FromClaim", "requests": ["gpu"],
                       "opaque": {"driver": DRIVER, "parameters": parameters}}]  # fmt: skip
        pods = [gpu * 2, gpu * 2 + 1] if here else []
        claims.append(
            {
                "metadata": {"namespace": "bench", "name": f"claim-{i}", "uid": f"claim-uid-{i}"},
                "status": {
                    "allocation": {
                        "devices": {
                            "results": [
                                {
                                    "request": "gpu",
                                    "driver": GPU_DRIVER,
                                    "pool": NODE if here else f"node-{i % 7}",
                                    "device": f"gpu-{gpu}",
                                }
                            ],
                            "config": config,
                        }
                    },
                    "reservedFor": [
                        {"resource": "pods", "name": f"p{p}", "uid": pod_uid(p)} for p in pods
                    ],
                },
            }
        )
    return claims


class FixedClaims:
    """The floor's claims view: one snapshot, built once, in memory."""

    def __init__(self, snapshot: ClaimsSnapshot) -> None:
        self._snapshot = snapshot

    def snapshot(self, pods: PodSnapshot) -> ClaimsSnapshot:
        return self._snapshot

    def close(self) -> None:
        return


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
                    "uuid": gpu_uuid(i),
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


def reconciler_for(
    world: SimWorld, pods: PodView, claims: ClaimView, proc_root: Path, state: Path
) -> Reconciler:
    clock = SystemClock()
    return Reconciler(
        backend=SimGpuBackend(world),
        pods=pods,
        claims=claims,
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
    claim_requests: int,
) -> None:
    med, floor_med, list_med = (statistics.median(s) for s in (kube_ms, floor_ms, list_ms))
    verdict = "met" if med <= 2 else "MISSED"
    print(
        f"capwatch cycle benchmark: {GPUS} GPUs, {PODS} pods, {PROCESSES} processes, "
        f"{CLAIMS} claims, {cycles} cycles, Python {sys.version.split()[0]}"
    )
    print(
        f"  cycle (kubernetes list+watch views): median {med:.3f} ms  p99 {p99(kube_ms):.3f} ms"
        f"  [target median <= 2 ms: {verdict}]"
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
        f"WATCH {watches / cycles:.3f}  [target 0 LIST: {'met' if lists == 0 else 'MISSED'}]"
    )
    print(
        f"  claims and slices requests per cycle in steady state: "
        f"{claim_requests / cycles:.3f}  [target 0: {'met' if claim_requests == 0 else 'MISSED'}]"
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


def seeded_server() -> FakeKubeApiServer:
    """The fake API server with this node's pods, slice and claims, and other nodes'."""
    server = FakeKubeApiServer()
    server.start()
    for i in range(PODS):
        # Pods 2g and 2g+1 share GPU g and its claim (claim-g), as a pod names its claims.
        uses = [f"claim-{i // 2}"] if i < 2 * GPUS else []
        server.add_pod(
            "bench", f"p{i}", node=NODE, uid=pod_uid(i), annotations=annotations(i), claims=uses
        )
    for i in range(200):  # pods on other nodes, which the field selector must keep out
        server.add_pod("other", f"q{i}", node=f"node-{i % 7}")
    server.put_slice(node_slice(NODE, [gpu_uuid(i) for i in range(GPUS)]))
    for n in range(7):  # other nodes' slices, which the field selector must keep out
        server.put_slice(node_slice(f"node-{n}", [f"GPU-{n}-{i}" for i in range(GPUS)]))
    for item in resource_claims():
        server.put_claim(item)
    return server


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

            memory_view = StaticPodView(
                PodInfo(
                    ref=PodRef(namespace="bench", name=f"p{i}", uid=pod_uid(i)),
                    annotations=annotations(i),
                )
                for i in range(PODS)
            )
            fixed = FixedClaims(claims.snapshot(view.snapshot()))
            floor = reconciler_for(world, memory_view, fixed, root / "proc", root / "state-mem")
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
    """Every cycle's time, for bench/plot.py's distribution."""
    return {
        "kube_ms": [round(ms, 4) for ms in kube_ms],
        "floor_ms": [round(ms, 4) for ms in floor_ms],
    }


if __name__ == "__main__":
    sys.exit(main())
