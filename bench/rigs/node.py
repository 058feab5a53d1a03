"""The benches' node: 8 GPUs, 110 pods, 64 GPU processes and 16 DRA claims, on the simulator.

bench/scenarios/cycle.py times its reconcile cycle, events.py floods it with device
events, and the stream bench's cycle-cost part publishes its cycles into the hub. Here:
its simulated world (the GPUs, the pods and their processes, a materialised proc tree),
the agent's reconciler over it, the fake API server seeded with its pods, slice and
claims (and other nodes'), and its pods in memory (the floor's pod view).

The pods: most annotated with a cap, some not, a few invalid; 64 processes, 8 per GPU,
each GPU shared by 2 pods. The 16 claims: 4 allocate GPUs 0-3 of this node with a
capwatch.io PowerCap (each reserved for the two pods sharing its GPU: the claims
decide), 4 allocate GPUs 4-7 with no capwatch config (the annotations decide), and 8 are
allocated on other nodes (which the agent never reads: its pods name the claims it
reads, by name, once each).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from capwatch.agent.attribution import Attributor, FsProcRoot
from capwatch.agent.dra.claims import API_VERSION, DRIVER, KIND, ClaimView
from capwatch.agent.ownership import OwnershipStore
from capwatch.agent.pods import PodInfo, PodRef, PodView
from capwatch.agent.reconciling import Policy, Reconciler
from capwatch.agent.sim.scenario import parse_scenario
from capwatch.agent.sim.views import SimGpuBackend
from capwatch.agent.sim.world import SimWorld
from capwatch.kit.clock import SystemClock
from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.fakes.pods import StaticPodView

NODE = "bench-node"
KEY = "capwatch.io/gpu-power-limit"
GPUS, PODS, PROCESSES, CLAIMS = 8, 110, 64, 16
GPU_DRIVER = "gpu.nvidia.com"


def gpu_uuid(i: int) -> str:
    return f"GPU-bbbbbbbb-0000-4000-8000-{i:012d}"


def pod_uid(i: int) -> str:
    return f"bbbbbbbb-0000-4000-8000-{i:012d}"


def annotations(i: int) -> dict[str, str]:
    # A realistic mix: most annotated, some not, a few invalid.
    if i % 10 == 9:
        return {}
    if i % 17 == 0:
        return {KEY: "lots"}
    return {KEY: str(300 + (i % 8) * 25)}


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


def build_world(proc_root: Path) -> SimWorld:
    """The node on the simulator, its processes' cgroup files under ``proc_root``."""
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
    """The agent's reconciler over ``world``, with these views, its record in ``state``."""
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


def memory_pods() -> StaticPodView:
    """The node's pods in memory: the floor's pod view, nothing behind it."""
    return StaticPodView(
        PodInfo(
            ref=PodRef(namespace="bench", name=f"p{i}", uid=pod_uid(i)), annotations=annotations(i)
        )
        for i in range(PODS)
    )


def seeded_server() -> FakeKubeApiServer:
    """The fake API server, started, with this node's pods, slice and claims, and other
    nodes'."""
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
