"""What the real node needs of this host, and what it leaves on it.

``check`` refuses, in one line, where the node cannot run: not root, a missing
OS package, a cgroup layout the tier was not proven on, another kubelet's
cgroups. The rest finds and removes host state a node made: mounts (the
containers' root filesystems, their /dev/shm, volumes, network namespaces),
the kubelet's cgroups in every hierarchy, and processes left in them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
# The kubelet's pod cgroups with cgroupsPerQOS and cgroupRoot "/" (its default).
KUBEPODS = "kubepods"
NETNS_DIR = Path("/run/netns")
CNI_BIN_DIR = "/usr/lib/cni"
TOOLS = {
    "containerd": "containerd",
    "runc": "runc",
    "ctr": "containerd",
    "iptables": "iptables",
    "ip": "iproute2",
    "gcc": "gcc",
}


class HostError(Exception):
    """This host cannot run the real node; the message says why in one line."""


def check() -> None:
    """Refuse (HostError) unless the node can run here."""
    if os.geteuid() != 0:
        raise HostError("the real node needs root (containerd, the kubelet, mounts, iptables)")
    missing = sorted({package for tool, package in TOOLS.items() if shutil.which(tool) is None})
    if missing:
        raise HostError(f"missing OS packages: {' '.join(missing)} (apt-get install them)")
    if not Path(CNI_BIN_DIR, "bridge").is_file():
        raise HostError(
            f"no CNI bridge plugin in {CNI_BIN_DIR}: apt-get install containernetworking-plugins"
        )
    if not (CGROUP_ROOT / "memory" / "memory.limit_in_bytes").is_file():
        raise HostError(
            "unsupported cgroup layout: the tier runs on cgroup v1 controllers (hybrid "
            f"layout) and {CGROUP_ROOT}/memory is not a v1 memory hierarchy"
        )
    taken = kubepods_dirs()
    if taken:
        raise HostError(f"another kubelet's cgroups are on this host: {taken[0]}")


def hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy (v1 controllers, name=systemd, the unified one)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        if after.split(" ", 1)[0] in {"cgroup", "cgroup2"}:
            found.append(Path(before.split()[4]))
    return found


def kubepods_dirs() -> list[Path]:
    return [path / KUBEPODS for path in hierarchies() if (path / KUBEPODS).is_dir()]


def cgroup_pids() -> set[int]:
    """Every process in a kubelet pod cgroup, in any hierarchy."""
    pids: set[int] = set()
    for top in kubepods_dirs():
        for procs in top.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(line) for line in procs.read_text().split())
    return pids


def alive(pid: int) -> bool:
    """Whether the process runs: not gone, and not a zombie waiting to be reaped (it holds
    nothing any more, whoever its parent is and however late it reaps)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def kill(pids: Iterable[int], *, wait_s: float = 10.0) -> None:
    """SIGKILL each, then wait (at most wait_s) until none runs: a signal sent is not a
    process gone, and what reads the host next must not find it still exiting."""
    killed = list(pids)
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while any(alive(pid) for pid in killed) and time.monotonic() < deadline:
        time.sleep(0.05)


def remove_cgroups(timeout: float = 20.0) -> list[str]:
    """rmdir every kubepods cgroup, deepest first, killing what is still in them; what stays."""
    deadline = time.monotonic() + timeout
    while True:
        kill(cgroup_pids())
        for top in kubepods_dirs():
            for directory in sorted(
                (path for path in top.rglob("*") if path.is_dir()),
                key=lambda path: len(path.parts),
                reverse=True,
            ):
                with contextlib.suppress(OSError):
                    directory.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()
        left = kubepods_dirs()
        if not left or time.monotonic() >= deadline:
            return [f"cgroup {path}" for path in left]
        time.sleep(0.2)


def mounts_under(prefixes: Iterable[Path]) -> list[Path]:
    """Mount points at or below any of prefixes, deepest first."""
    roots = [str(prefix) for prefix in prefixes]
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == root or point.startswith(root.rstrip("/") + "/") for root in roots):
            found.append(Path(point))
    return sorted(set(found), key=lambda path: len(path.parts), reverse=True)


def netns_mounts() -> set[Path]:
    """The network namespaces pinned under /run/netns (the CRI plugin's pods')."""
    return {path for path in mounts_under([NETNS_DIR]) if path != NETNS_DIR}


def unmount(points: Iterable[Path]) -> list[str]:
    """umount each (lazily if busy); the ones still mounted."""
    for point in points:
        done = subprocess.run(["umount", str(point)], capture_output=True, check=False)
        if done.returncode != 0:
            subprocess.run(["umount", "--lazy", str(point)], capture_output=True, check=False)
    still = {str(point) for point in mounts_under(points)}
    return [f"mount {point}" for point in sorted(still)]


def remove_tree(path: Path) -> list[str]:
    """rm -rf path once nothing is mounted in it; what could not go."""
    if not path.exists():
        return []
    mounted = mounts_under([path])
    if mounted:
        return [f"mount {point}" for point in mounted]
    shutil.rmtree(path, ignore_errors=True)
    return [f"directory {path}"] if path.exists() else []


def processes_with(needle: str) -> list[int]:
    """Processes whose command line contains needle (a containerd shim's -address)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
    return pids
