"""bench/scenarios/kwok.py's cluster: KWOK on the real control plane with the chart
installed, the pools at its pod IPs, the controller as its StatefulSet's pod, a plain
Node watcher (bench/rigs/node_watcher.py) and any other process the bench runs beside
them (the floor), and the API server's own metrics."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.shared.addresses import free_port
from bench.shared.procs import Metrics, cpu_seconds, parse_metrics, rss_mib
from tests.chart.support import CHART, Helm
from tests.realkube.access import BoundPod
from tests.realkube.components import CONTROLLER_REPLACED
from tests.realkube.controlplane import ControlPlane
from tests.realkube.local import downward_env, flag, without_flags

RELEASE = NAMESPACE = "capwatch"
PREFIX = "kwok-gpu-"
AGENTS = (
    "app.kubernetes.io/name=capwatch,app.kubernetes.io/component=node-agent,"
    f"app.kubernetes.io/instance={RELEASE}"
)
CONTROLLERS = f"app.kubernetes.io/name=capwatch-controller,app.kubernetes.io/instance={RELEASE}"
CAPWATCH = (sys.executable, "-m", "capwatch.cli")


@dataclass
class Cluster:
    plane: ControlPlane
    work: Path
    rendered: list[dict[str, Any]] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def install(self, helm: Helm, values: Sequence[str]) -> None:
        template = helm.run("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *values)
        if template.returncode != 0:
            raise SystemExit(f"helm template failed: {template.stderr}")
        self.rendered = [o for o in yaml.safe_load_all(template.stdout) if o]
        done = helm.run(
            "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
            "--kubeconfig", str(self.plane.kubeconfig), *values,
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"helm install failed: {done.stderr}")

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> int:
        log = (self.work / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": os.getcwd(), **(env or {})},
        )
        self.procs.append(proc)
        return proc.pid

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def pools(
        self, names: list[str], ips: dict[str, str], port: int, args: Any, out: Path
    ) -> list[Path]:
        """``args.pools`` pools, each serving its share of the nodes at their pod IPs."""
        per = -(-len(names) // args.pools)
        transitions = []
        fault = f"write_failed:{args.fail_fraction}@{args.fail_at}+{args.fail_for}"
        for k in range(args.pools):
            share = names[k * per : (k + 1) * per]
            if not share:
                break
            path = out / f"transitions-{k}.jsonl"
            self.start(
                f"pool-{k}",
                [
                    *CAPWATCH, "pool", f"--nodes={len(share)}", f"--first-index={k * per}",
                    f"--name-prefix={PREFIX}", f"--gpus={args.gpus}",
                    f"--interval={args.interval:g}",
                    f"--transitions-out={path}", f"--fault={fault}", "--log-level=warning",
                    *(f"--grpc-listen={ips[n]}:{port}" for n in share),
                ],
            )  # fmt: skip
            transitions.append(path)
        return transitions

    def controller(self, heartbeat_s: float, replica: int = 0) -> tuple[int, int]:
        """Replica ``replica`` of the StatefulSet (its pod, a token bound to it), with the
        chart's args; returns its pid and metrics port."""
        statefulset = next(o for o in self.rendered if o["kind"] == "StatefulSet")
        (container,) = statefulset["spec"]["template"]["spec"]["containers"]
        pods = self.plane.request(
            "GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={CONTROLLERS}"
        )["items"]
        pod = next(p for p in pods if p["metadata"]["name"].endswith(f"-{replica}"))
        bound = BoundPod(pod["metadata"]["name"], pod["metadata"]["uid"])
        token = self.plane.token(NAMESPACE, pod["spec"]["serviceAccountName"], pod=bound)
        config = self.plane.token_kubeconfig(
            token, self.work / f"controller-{replica}.kubeconfig", namespace=NAMESPACE
        )
        metrics = free_port()
        args = [
            *CAPWATCH,
            *without_flags(container["args"], CONTROLLER_REPLACED),
            f"--kubeconfig={config}",
            f"--agent-port={flag(container['args'], '--agent-port')}",
            "--grpc-listen=127.0.0.1:0", f"--metrics-port={metrics}", "--probe-port=0",
            f"--condition-heartbeat={heartbeat_s:g}", "--log-format=text",
        ]  # fmt: skip
        name = "controller" if replica == 0 else f"controller-{replica}"
        return self.start(name, args, downward_env(container, pod)), metrics

    def watcher(self, out: Path) -> int:
        pki = self.plane.pki
        return self.start(
            "watcher",
            [
                sys.executable, "-m", "bench.rigs.node_watcher", self.plane.url,
                str(self.plane.ca_path), str(pki.admin.cert), str(pki.admin.key), str(out),
            ],
        )  # fmt: skip

    def component_pids(self) -> dict[str, int]:
        return {p.name: p.pid for p in self.plane.processes}


def apiserver_metrics(plane: ControlPlane) -> Metrics:
    return parse_metrics(plane.request_text("GET", "/metrics", timeout=60.0))


def _labels(key: tuple[tuple[str, str], ...]) -> dict[str, str]:
    return dict(key)


# The condition is a server-side apply, which the API server counts under the verb APPLY;
# a strategic-merge patch (the cleanup's, an older capwatch's) under PATCH.
STATUS_PATCH = {"resource": "nodes", "subresource": "status"}
STATUS_VERBS = ("PATCH", "APPLY")


def _status_write(labels: Mapping[str, str]) -> bool:
    return labels.get("verb") in STATUS_VERBS and all(
        labels.get(k) == v for k, v in STATUS_PATCH.items()
    )


def status_patches(metrics: Mapping[Any, float]) -> dict[str, float]:
    """Writes of nodes/status (apply or patch) answered, by code."""
    out: dict[str, float] = {}
    for (name, key), value in metrics.items():
        labels = _labels(key)
        if name == "apiserver_request_total" and _status_write(labels):
            out[labels["code"]] = out.get(labels["code"], 0.0) + value
    return out


def patch_latency_buckets(metrics: Mapping[Any, float]) -> list[tuple[float, float]]:
    """(le, cumulative count) of the server-side duration of nodes/status writes."""
    buckets: dict[float, float] = {}
    for (name, key), value in metrics.items():
        labels = _labels(key)
        if name == "apiserver_request_duration_seconds_bucket" and _status_write(labels):
            le = math.inf if labels["le"] == "+Inf" else float(labels["le"])
            buckets[le] = buckets.get(le, 0.0) + value
    return sorted(buckets.items())


def quantile(
    buckets: list[tuple[float, float]], before: list[tuple[float, float]], q: float
) -> float:
    """The q-quantile of what fell in the buckets between two scrapes (upper bound of its
    bucket, as histogram_quantile's worst case)."""
    was = dict(before)
    counts = [(le, count - was.get(le, 0.0)) for le, count in buckets]
    total = counts[-1][1] if counts else 0.0
    if total <= 0:
        return math.nan
    for le, count in counts:
        if count >= q * total:
            return le
    return math.inf


def usage(pids: Mapping[str, int]) -> dict[str, tuple[float, float]]:
    """Per process: (CPU seconds so far, RSS MiB now)."""
    return {name: (cpu_seconds(pid), rss_mib(pid)) for name, pid in pids.items()}


def watched(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
