"""An agent's cost against the number of ResourceClaims of other nodes (issue 27).

    .venv/bin/python -m bench.scenarios.claims_scale [--foreign 20000] [--window 20]

One real kube-apiserver and etcd (tests/realkube, auditing every request). A node of
8 GPUs with the NVIDIA driver's ResourceSlice, and 8 pods bound to it, each with a
claim allocated one GPU with a capwatch PowerCap. A real ``capwatch agent`` (the
nvml backend on the fake NVML, 1 s interval, its own client certificate so the audit
log tells its requests apart) runs for ``--window`` seconds:

1. **baseline**: no other claim in the cluster;
2. then ``--foreign`` claims allocated on other nodes' pools are created (in another
   namespace), while that first agent keeps running: its requests during the creation;
3. **loaded**: a fresh agent started with them all in place, for the same window.

Printed: each agent's RSS at the window's end and its requests by verb and resource,
and the loaded/baseline ratios (an agent that lists claims cluster-wide holds and
decodes every one of them: RSS and the LIST's bytes grow with the cluster; one that
reads its pods' claims by name does not). Needs the control plane built (make kube)
and the fake NVML (make fakenvml).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.figures.results import write_json
from bench.shared.procs import status_kib
from tests.fakenvml.build import build as build_fakenvml
from tests.fakenvml.values import FakeConfig, FakeDevice
from tests.realkube.audit import AuditLog, audited_plane
from tests.realkube.controlplane import ControlPlane, build_kube
from tests.realkube.dra import RESOURCE, ensure_device_class, resource_slice

NODE = "bench-node"
ROOT = Path(__file__).resolve().parents[2]
GPUS = 8
NAMESPACE, FOREIGN_NS = "jobs", "elsewhere"
AGENT_USER = "capwatch-bench-agent"
DRIVER = "gpu.nvidia.com"


def uuid_of(index: int) -> str:
    return f"GPU-be0c0000-0000-4000-8000-{index:012d}"


def claim_body(
    name: str, pool: str, device: str, watts: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A claim's object and its allocated status (as the scheduler writes it)."""
    config = {"opaque": {"driver": "capwatch.io", "parameters": {
        "apiVersion": "capwatch.io/v1alpha1", "kind": "PowerCap", "watts": watts}}}  # fmt: skip
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}],
            "config": [config]}},
    }  # fmt: skip
    status = {"allocation": {"devices": {
        "results": [{"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}],
        "config": [{"source": "FromClaim", **config}]}}}  # fmt: skip
    return body, status


def create_claim(
    plane: ControlPlane,
    namespace: str,
    name: str,
    pool: str,
    device: str,
    watts: int,
    *,
    pod: dict[str, Any] | None = None,
) -> None:
    """The claim, then its allocation (and its reservation for ``pod``) in its status."""
    body, status = claim_body(name, pool, device, watts)
    made = plane.request("POST", f"{RESOURCE}/namespaces/{namespace}/resourceclaims", body)
    if pod is not None:
        metadata = pod["metadata"]
        status["reservedFor"] = [
            {"resource": "pods", "name": metadata["name"], "uid": metadata["uid"]}
        ]
    made["status"] = status
    path = f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}/status"
    plane.request("PUT", path, made)


def node_with_claims(plane: ControlPlane) -> None:
    """The node, its slice, and a pod bound to it per GPU, each with its own claim."""
    node = plane.request("POST", "/api/v1/nodes", {
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})  # fmt: skip
    devices = {f"gpu-{i}": uuid_of(i) for i in range(GPUS)}
    plane.request("POST", f"{RESOURCE}/resourceslices", resource_slice(node, devices))
    for namespace in (NAMESPACE, FOREIGN_NS):
        plane.create_namespace(namespace)
    for i in range(GPUS):
        pod = plane.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"job-{i}"},
            "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "job",
                     "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": f"job-{i}"}]},
        })  # fmt: skip
        create_claim(plane, NAMESPACE, f"job-{i}", NODE, f"gpu-{i}", 300 + 10 * i, pod=pod)


def foreign_claims(plane: ControlPlane, count: int) -> float:
    """``count`` claims allocated on other nodes' pools (8 threads); seconds it took."""
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        futures = [
            pool.submit(
                create_claim, plane, FOREIGN_NS, f"c-{i}", f"node-{i // 8}", f"gpu-{i % 8}", 400
            )
            for i in range(count)
        ]
        for future in futures:
            future.result()
    return time.monotonic() - start


class Agent:
    """A ``capwatch agent`` on the fake NVML against the bench's API server."""

    def __init__(self, plane: ControlPlane, directory: Path, fakenvml: Path) -> None:
        directory.mkdir(parents=True)
        config = FakeConfig(devices=tuple(FakeDevice(uuid=uuid_of(i)) for i in range(GPUS))).write(
            directory / "fake-nvml.conf"
        )
        kubeconfig = plane.component_kubeconfig("bench-agent", AGENT_USER, ("system:masters",))
        env = {
            **os.environ,
            "LD_LIBRARY_PATH": str(fakenvml),
            "FAKE_NVML_CONFIG": str(config),
            "KUBERNETES_SERVICE_HOST": "",
        }
        self.log = directory / "agent.log"
        argv = [
            str(ROOT / ".venv" / "bin" / "capwatch"), "agent", "--gpu-backend", "nvml",
            "--node-name", NODE, "--kubeconfig", str(kubeconfig), "--interval", "1",
            "--state-dir", str(directory / "state"), "--proc-root", str(directory),
            "--grpc-listen", "127.0.0.1:0", "--metrics-port", "0", "--pod-events", "false",
        ]  # fmt: skip
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)

    def enforced_cycles(self) -> int:
        """Cycles the agent logged as enforced (its text log's ``cycle`` lines)."""
        return self.log.read_text(errors="replace").count("enforced=true")

    def rss_mib(self) -> float:
        """Its resident set now; RuntimeError once it has exited."""
        return status_kib(self.process.pid) / 1024

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def requests_by_kind(audit: AuditLog, since: int) -> dict[str, int]:
    counts = collections.Counter(
        f"{c.verb} {c.resource}" for c in audit.calls(user=AGENT_USER, since=since)
    )
    return dict(sorted(counts.items()))


def window(
    plane: ControlPlane, audit: AuditLog, directory: Path, fakenvml: Path, seconds: float
) -> dict[str, Any]:
    """One agent's RSS and requests over a window of ``seconds`` from its start."""
    mark = audit.mark()
    agent = Agent(plane, directory, fakenvml)
    try:
        time.sleep(seconds)
        if agent.process.poll() is not None:
            raise RuntimeError(f"the agent exited: {agent.log.read_text()[-2000:]}")
        rss = agent.rss_mib()
        cycles = agent.enforced_cycles()
    finally:
        agent.stop()
    requests = requests_by_kind(audit, mark)
    return {"rss_mib": round(rss, 1), "enforced_cycles": cycles, "requests": requests,
            "request_count": sum(requests.values())}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--foreign", type=int, default=20_000, help="claims of other nodes")
    parser.add_argument("--window", type=float, default=20.0, help="seconds each agent runs")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    args = parser.parse_args(argv)
    binaries = build_kube().cached_binaries()
    if binaries is None:
        print("claims_scale: the control plane is not built: make kube", file=sys.stderr)
        return 1
    fakenvml = build_fakenvml(ROOT / "build" / "fakenvml")
    with tempfile.TemporaryDirectory(prefix="capwatch-claims-bench-") as scratch:
        base = Path(scratch)
        with audited_plane(base / "plane", binaries) as plane:
            audit = AuditLog(base / "plane" / "audit.log")
            ensure_device_class(plane)
            node_with_claims(plane)
            baseline = window(plane, audit, base / "baseline", fakenvml, args.window)
            # The first agent again, running while the foreign claims are made.
            mark = audit.mark()
            during = Agent(plane, base / "during", fakenvml)
            time.sleep(3)
            before_creation = requests_by_kind(audit, mark)
            took = foreign_claims(plane, args.foreign)
            time.sleep(3)
            during_requests = requests_by_kind(audit, mark)
            during.stop()
            loaded = window(plane, audit, base / "loaded", fakenvml, args.window)
    created = {k: v - before_creation.get(k, 0) for k, v in during_requests.items()}
    print(
        f"claims_scale: {GPUS} claims on this node; "
        f"{args.foreign} foreign claims made in {took:.0f} s"
    )
    for label, figures in (("baseline", baseline), ("loaded", loaded)):
        print(
            f"  {label:8} RSS {figures['rss_mib']:6.1f} MiB  requests {figures['request_count']:4d}"
            f"  enforced cycles {figures['enforced_cycles']}  {figures['requests']}"
        )
    print(f"  requests of a running agent while they were made: {sum(created.values())} {created}")
    rss_ratio = loaded["rss_mib"] / baseline["rss_mib"]
    request_ratio = loaded["request_count"] / max(1, baseline["request_count"])
    print(f"  ratio loaded/baseline: RSS {rss_ratio:.3f}, requests {request_ratio:.3f}")
    if args.json is not None:
        write_json(args.json, {
            "foreign": args.foreign,
            "window_s": args.window, "baseline": baseline, "loaded": loaded,
            "requests_while_created": created, "rss_ratio": round(rss_ratio, 3),
            "request_ratio": round(request_ratio, 3)})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
