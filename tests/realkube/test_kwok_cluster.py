"""A real cluster's shape, end to end, at 200 nodes: KWOK nodes, the chart installed with
helm, the DaemonSet's agent pods scheduled by the real controllers and Running at a
loopback pod IP of each node's own; ``capwatch pool`` answering on every one of them;
the controller, as the StatefulSet's own pods, discovering the agent pods from the API
server and holding one connection per node; a fault flipping some nodes' conditions
False and back, with their Events (tests/realkube/kwok_cluster.py)."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.support import CHART, Helm
from tests.realkube.access import BoundPod
from tests.realkube.components import CONTROLLER_REPLACED
from tests.realkube.controlplane import ControlPlane
from tests.realkube.kwok_cluster import KwokNodes, in_own_cidr, kwok_plane
from tests.realkube.local import Processes, downward_env, flag, without_flags

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

NODES = 200
RELEASE = "capwatch"
NAMESPACE = "capwatch"
PREFIX = "kwok-gpu-"
AGENTS = (
    f"app.kubernetes.io/name=capwatch,app.kubernetes.io/component=node-agent,"
    f"app.kubernetes.io/instance={RELEASE}"
)
CONTROLLERS = f"app.kubernetes.io/name=capwatch-controller,app.kubernetes.io/instance={RELEASE}"
FAILING = 0.1  # of the nodes, from 30 s after the pool starts, for 15 s


@pytest.fixture(scope="module")
def plane(
    realkube_binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    with kwok_plane(tmp_path_factory.mktemp("kwok"), realkube_binaries) as started:
        yield started


def _remote_addresses(pid: int) -> set[tuple[str, int]]:
    """The remote (IPv4 address, port) of every established TCP connection ``pid`` holds
    (IPv4, and IPv4-mapped IPv6 as grpc's sockets are), by its sockets' inodes."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().name
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "01" or fields[9] not in inodes:  # ESTABLISHED, and its own
                continue
            address, port = fields[2].split(":")
            raw = bytes.fromhex(address)
            # Each 32-bit word is in host (little-endian) order; IPv4 is the last word.
            ip = socket.inet_ntoa(raw[-4:][::-1])
            found.add((ip, int(port, 16)))
    return found


def _condition(plane: ControlPlane, node: str) -> tuple[str, str] | None:
    got = plane.request("GET", f"/api/v1/nodes/{node}")
    for c in got.get("status", {}).get("conditions") or []:
        if c["type"] == "GPUPowerCapEnforced":
            return (c["status"], c["reason"])
    return None


def _wait(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1.0)


def test_the_chart_on_kwok_nodes_one_connection_per_node(
    plane: ControlPlane, helm: Helm, tmp_path: Path
) -> None:
    """The whole path at 200 nodes: every agent pod Running at an IP of its own node's
    podCIDR, the controller dialling each (one connection per pod IP), every node
    True, the failing tenth False with a Warning Event and back True with a Normal one."""
    plane.create_namespace(NAMESPACE)
    nodes = KwokNodes.create(plane, PREFIX, NODES)
    nodes.wait_ready(timeout=180)
    values = ("--set", "controller.enabled=true")
    rendered = helm.run("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *values)
    assert rendered.returncode == 0, rendered.stderr
    done = helm.run(
        "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
        "--kubeconfig", str(plane.kubeconfig), *values,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ips = nodes.wait_pods(NAMESPACE, AGENTS, timeout=600)
    assert len(set(ips.values())) == NODES
    assert in_own_cidr(ips, nodes.names)

    objects = [o for o in yaml.safe_load_all(rendered.stdout) if o]
    statefulset = next(o for o in objects if o["kind"] == "StatefulSet")
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    port = int(flag(container["args"], "--agent-port"))
    replicas = sorted(
        nodes.plane.request(
            "GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={CONTROLLERS}"
        )["items"],
        key=lambda p: p["metadata"]["name"],
    )
    assert [p["metadata"]["name"] for p in replicas] == [
        "capwatch-controller-0",
        "capwatch-controller-1",
    ]
    processes = Processes(tmp_path)
    try:
        pool = processes.start(
            "pool",
            [
                "pool", f"--nodes={NODES}", f"--name-prefix={PREFIX}", "--gpus=2",
                "--interval=2", f"--fault=write_failed:{FAILING}@30+15", "--log-level=warning",
                *(f"--grpc-listen={ips[name]}:{port}" for name in nodes.names),
            ],
        )  # fmt: skip
        controllers = []
        for pod in replicas:
            bound = BoundPod(pod["metadata"]["name"], pod["metadata"]["uid"])
            account = pod["spec"]["serviceAccountName"]
            token = plane.token(NAMESPACE, account, pod=bound)
            config = plane.token_kubeconfig(
                token, tmp_path / f"{bound.name}.kubeconfig", namespace=NAMESPACE
            )
            args = [
                *without_flags(container["args"], CONTROLLER_REPLACED),
                f"--kubeconfig={config}", f"--agent-port={port}",
                "--grpc-listen=127.0.0.1:0", "--metrics-port=0", "--probe-port=0",
                "--lease-duration=4", "--renew-deadline=3", "--retry-period=0.5",
                "--log-format=text",
            ]  # fmt: skip
            controllers.append(processes.start(bound.name, args, downward_env(container, pod)))

        def all_true() -> bool:
            assert pool.popen.poll() is None, pool.stderr.read_text()[-2000:]
            return all(_condition(plane, n) == ("True", "CapsEnforced") for n in nodes.names)

        _wait(all_true, 240, "every node True")
        for process in controllers:  # leader and hot standby alike
            remote = _remote_addresses(process.popen.pid)
            assert {(ip, port) for ip in ips.values()} <= remote

        def failed() -> list[str]:
            return [n for n in nodes.names if _condition(plane, n) == ("False", "CapWriteFailed")]

        _wait(lambda: len(failed()) >= NODES * FAILING * 0.5, 120, "the failing nodes False")
        flipped = failed()
        _wait(all_true, 120, "every node True again")
        for node in flipped[:5]:
            selector = f"involvedObject.kind=Node,involvedObject.name={node}"
            events = plane.request("GET", f"/api/v1/events?fieldSelector={selector}")["items"]
            said = [(e["type"], e["reason"]) for e in events]
            assert ("Warning", "CapWriteFailed") in said
            assert ("Normal", "CapsEnforced") in said
    finally:
        processes.close()
        subprocess.run(
            [str(helm.binary), "uninstall", RELEASE, "--namespace", NAMESPACE, "--no-hooks",
             "--kubeconfig", str(plane.kubeconfig)],
            capture_output=True, check=False, timeout=120,
            env={"HOME": str(helm.home), "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        nodes.delete()
