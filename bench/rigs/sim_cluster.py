"""The simulated cluster's processes (bench/scenarios/cluster.py, controller.py, heap.py):
the fake API server, the pools, the controllers.

Each is started as the real command (``capwatch pool``, ``capwatch controller``,
``python -m bench.rigs.apiserver``) and read from outside as an operator would: its
targets and transitions files, its metrics endpoint, /proc for its CPU and RSS
(bench.shared.procs). By default every node answers at an address of its own
(bench.shared.addresses), as a real cluster's pod IPs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bench.shared.addresses import free_port, node_address
from bench.shared.procs import scrape
from capwatch.agent.sim.poolspec import node_names

PREFIX = "sim-node-"
GPU_LABEL = "nvidia.com/gpu.present=true"
CAPWATCH = (sys.executable, "-m", "capwatch.cli")


@dataclass
class Controller:
    shard: int
    proc: subprocess.Popen[bytes]
    grpc_port: int
    metrics_port: int
    log: Path


@dataclass
class Run:
    args: argparse.Namespace
    work: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    api: subprocess.Popen[str] | None = None
    controllers: list[Controller] = field(default_factory=list)
    # How a controller is started: the command, or a wrapper around it (heap.py's).
    launcher: tuple[str, ...] = CAPWATCH
    transitions: list[Path] = field(default_factory=list)
    # Per node: each pool's first and last address, listening once the pool is up.
    probes: list[tuple[str, int]] = field(default_factory=list)

    def stop(self) -> None:
        for proc in [c.proc for c in self.controllers] + self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in [c.proc for c in self.controllers] + self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            if proc.poll() is None:
                proc.kill()
        if self.api is not None and self.api.poll() is None:
            assert self.api.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                self.api.stdin.write("quit\n")
                self.api.stdin.flush()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.api.wait(10)


def start_api(run: Run) -> str:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    run.api = subprocess.Popen(
        [sys.executable, "-m", "bench.rigs.apiserver", str(run.args.nodes), PREFIX, GPU_LABEL],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert run.api.stdout is not None
    line = run.api.stdout.readline().split()
    if line[:1] != ["url"]:
        raise SystemExit("the fake API server did not start")
    return line[1]


def api_writes(run: Run) -> list[dict[str, object]]:
    assert run.api is not None
    assert run.api.stdin is not None
    assert run.api.stdout is not None
    path = run.work / "writes.jsonl"
    run.api.stdin.write(f"writes {path}\n")
    run.api.stdin.flush()
    assert run.api.stdout.readline().strip() == "ok"
    return [json.loads(line) for line in path.read_text().splitlines()]


def start_pools(run: Run) -> list[Path]:
    """The pools; each writes a targets file. Per node (the default shape, a real
    cluster's): every node at an address of its own, so the controller holds one
    connection per node. Shared (``--shared-addresses``): every node of a pool behind
    the pool's one address, the controller's connections shared by thousands of streams."""
    a = run.args
    per = -(-a.nodes // a.pools)
    fault = f"write_failed:{a.fail_fraction}@{a.fail_at}+{a.fail_for}"
    targets = []
    port = free_port()
    for k in range(a.pools):
        first, count = k * per, min(per, a.nodes - k * per)
        if count <= 0:
            break
        out, trans = run.work / f"targets-{k}.txt", run.work / f"transitions-{k}.jsonl"
        if a.shared_addresses:
            listen = ["--grpc-listen", f"127.0.0.1:{free_port()}", "--targets-out", str(out)]
        else:
            names = node_names(count, prefix=PREFIX, first=first)
            addresses = [f"{node_address(first + i)}:{port}" for i in range(count)]
            run.probes += [(node_address(first), port), (node_address(first + count - 1), port)]
            listen = [arg for address in addresses for arg in ("--grpc-listen", address)]
            out.write_text(
                "".join(f"{n} {addr}\n" for n, addr in zip(names, addresses, strict=True))
            )
        log = (run.work / f"pool-{k}.log").open("wb")
        run.procs.append(
            subprocess.Popen(
                [
                    *CAPWATCH,
                    "pool",
                    "--nodes", str(count),
                    "--first-index", str(first),
                    "--name-prefix", PREFIX,
                    "--gpus", str(a.gpus),
                    "--interval", str(a.interval),
                    *listen,
                    "--transitions-out", str(trans),
                    "--fault", fault,
                    "--log-level", "warning",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )  # fmt: skip
        targets.append(out)
        run.transitions.append(trans)
    return targets


def shape(args: argparse.Namespace) -> str:
    """What every figure is measured in: one address per node, or the shared shape."""
    if args.shared_addresses:
        return f"SHARED: {args.nodes} nodes behind {args.pools} addresses"
    return "one address per node"


def kubeconfig(url: str, path: Path) -> None:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
        f"clusters: [{{name: fake, cluster: {{server: '{url}'}}}}]\n"
        "users: [{name: fake, user: {}}]\n"
        "contexts: [{name: fake, context: {cluster: fake, user: fake}}]\n"
    )


def start_controllers(run: Run, targets: Path, config: Path) -> None:
    a = run.args
    for shard in range(a.shards):
        grpc_port, metrics_port = free_port(), free_port()
        log = run.work / f"controller-{shard}.log"
        proc = subprocess.Popen(
            [
                *run.launcher,
                "controller",
                "--targets", str(targets),
                "--namespace", "bench",
                "--kubeconfig", str(config),
                "--gpu-node-selector", GPU_LABEL,
                "--shards", str(a.shards),
                "--shard-index", str(shard),
                "--identity", f"bench-controller-{shard}",
                "--condition-heartbeat", str(a.heartbeat),
                "--grpc-listen", f"127.0.0.1:{grpc_port}",
                "--metrics-port", str(metrics_port),
                "--probe-port", "0",
                "--log-level", "warning",
            ],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        run.controllers.append(Controller(shard, proc, grpc_port, metrics_port, log))


def connected(metrics_port: int) -> int:
    """The streams a controller (its metrics on ``metrics_port``) holds connected; 0 before
    it serves its metrics."""
    try:
        found = scrape(metrics_port)
    except OSError:
        return 0
    return int(found.get(("capwatch_controller_streams", (("state", "connected"),)), 0))
