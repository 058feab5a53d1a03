"""The node comes up Ready with a pod running on it, and down leaves the host as it was:
no process, mount, cgroup, network device, iptables rule or kubelet directory."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.realnode import host, network
from tests.realnode.cluster import wait_for
from tests.realnode.conftest import make_node
from tests.realnode.node import CAPWATCH_STATE, CNI_CACHE, run_dir
from tests.realnode.workload import workload_pod

ROOT = Path(__file__).resolve().parents[2]
OURS = {
    "kubelet",
    "containerd",
    "containerd-shim",
    "containerd-shim-runc-v2",
    "etcd",
    "kube-apiserver",
    "kube-controller",
    "kube-scheduler",
    "pause",
}


@dataclass(frozen=True)
class HostState:
    """Everything a node could leave behind, read off the host."""

    processes: frozenset[tuple[int, str]]
    mounts: frozenset[str]
    cgroups: frozenset[str]
    links: frozenset[str]
    iptables: tuple[str, ...]
    paths: frozenset[str]


def read_host(directory: Path) -> HostState:
    processes = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                name = (entry / "comm").read_text().strip()
            except OSError:
                continue
            if name in OURS and host.alive(int(entry.name)):
                processes.add((int(entry.name), name))
    mounts = {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}
    links = subprocess.run(
        ["ip", "-o", "link", "show"], capture_output=True, text=True, check=True
    ).stdout
    rules = tuple(
        subprocess.run(
            ["iptables", "-t", table, "-S"], capture_output=True, text=True, check=True
        ).stdout
        for table in ("nat", "filter")
    )
    candidates = (
        directory / "kubelet",
        directory / "containerd",
        run_dir(directory),
        Path("/var/lib/kubelet"),
        CNI_CACHE,
        CAPWATCH_STATE,
    )
    return HostState(
        processes=frozenset(processes),
        mounts=frozenset(mounts),
        cgroups=frozenset(str(path) for path in host.kubepods_dirs()),
        links=frozenset(line.split(":")[1].strip().split("@")[0] for line in links.splitlines()),
        iptables=rules,
        paths=frozenset(str(path) for path in candidates if path.exists()),
    )


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_up_runs_a_pod_and_down_leaves_the_host_as_it_was(
    realnode_parts: dict[str, Path], tmp_path: Path
) -> None:
    """A node up, a pod Running on it (so there are containers, a network namespace,
    volumes and pod cgroups to remove), then down: the host reads exactly as before."""
    directory = tmp_path / "node"
    before = read_host(directory)
    node = make_node(directory, realnode_parts)
    node.up()
    try:
        assert node.node_ready()
        node.plane.create_namespace("lifecycle")
        node.plane.request(
            "POST", "/api/v1/namespaces/lifecycle/pods", workload_pod("sleeper", watts=None)
        )

        def running() -> bool:
            pod = node.plane.request("GET", "/api/v1/namespaces/lifecycle/pods/sleeper")
            return bool(pod.get("status", {}).get("phase") == "Running")

        wait_for(running, 120.0, "the pod Running on the real node")
        during = read_host(directory)
        assert network.BRIDGE in during.links
        assert during.cgroups
        assert any(mount.startswith(str(directory)) for mount in during.mounts)
        assert {name for _, name in during.processes} >= {"kubelet", "containerd", "pause"}
    finally:
        node.down()
    after = read_host(directory)
    assert after == before
    assert node.leftovers() == []


def test_up_refuses_without_root_in_one_line(tmp_path: Path) -> None:
    """Not root: `realnode.py up` says so in one line and exits 1, having built nothing."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to another user")
    done = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            sys.executable,
            str(ROOT / "scripts" / "realnode.py"),
            "up",
            "--dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "realnode: the real node needs root (containerd, the kubelet, mounts, iptables)"
    ]
    assert done.stdout == ""
