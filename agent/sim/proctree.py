"""Writes a fake ``/proc`` tree whose ``<pid>/cgroup`` files look like a real node's.

The simulator materialises one for its processes so the real attribution code
(:class:`capwatch.agent.attribution.FsProcRoot` and :class:`~capwatch.agent.attribution.Attributor`)
runs unchanged in simulation; tests use it to cover every layout. It is the
inverse of :func:`capwatch.agent.attribution.pod_uid_from_cgroup`.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from capwatch.agent.attribution import canonical_pod_uid
from capwatch.kit.errors import ConfigError

_CONTAINER_ID = re.compile("[0-9a-f]{64}", re.ASCII)


class CgroupLayout(str, Enum):
    """How a node lays out its cgroups: cgroup version, kubelet driver, runtime."""

    V2_SYSTEMD_CONTAINERD = "v2-systemd-containerd"
    V2_SYSTEMD_CRIO = "v2-systemd-crio"
    V2_CGROUPFS_CONTAINERD = "v2-cgroupfs-containerd"
    V2_CGROUPFS_CRIO = "v2-cgroupfs-crio"
    V1_SYSTEMD_CONTAINERD = "v1-systemd-containerd"
    V1_SYSTEMD_CRIO = "v1-systemd-crio"
    V1_CGROUPFS_CONTAINERD = "v1-cgroupfs-containerd"
    V1_CGROUPFS_CRIO = "v1-cgroupfs-crio"
    # A kind node on a cgroup v2 host: the kubelet runs with --cgroup-root=/kubelet.
    V2_KIND_SYSTEMD_CONTAINERD = "v2-kind-systemd-containerd"
    # A node inside a Docker container on a cgroup v1 host (old kind, CI runners),
    # seen from the host: the kubelet's hierarchy sits below the container's cgroup.
    V1_KIND_CGROUPFS_CONTAINERD = "v1-kind-cgroupfs-containerd"

    @property
    def is_v1(self) -> bool:
        return self.value.startswith("v1-")

    @property
    def is_systemd(self) -> bool:
        return "-systemd-" in self.value

    @property
    def is_crio(self) -> bool:
        return self.value.endswith("-crio")


class QosClass(str, Enum):
    """A pod's Kubernetes QoS class; it decides the pod cgroup's parent."""

    GUARANTEED = "guaranteed"
    BURSTABLE = "burstable"
    BESTEFFORT = "besteffort"


@dataclass(frozen=True, kw_only=True)
class ProcSpec:
    """One process in a fake proc tree.

    ``pod_uid`` None is a process outside Kubernetes (a user's session on the
    node). ``container_id`` None derives a stable 64-hex id from ``pid``.
    Raises :class:`~capwatch.kit.errors.ConfigError` for values no real node produces.
    """

    pid: int
    pod_uid: str | None
    qos: QosClass = QosClass.BURSTABLE
    layout: CgroupLayout = CgroupLayout.V2_SYSTEMD_CONTAINERD
    container_id: str | None = None

    def __post_init__(self) -> None:
        if self.pid < 1:
            raise ConfigError("pid", f"must be at least 1, got {self.pid}")
        if self.pod_uid is not None and canonical_pod_uid(self.pod_uid) != self.pod_uid:
            raise ConfigError("pod_uid", f"must be a lower-case dashed UUID, got {self.pod_uid!r}")
        if self.container_id is not None and _CONTAINER_ID.fullmatch(self.container_id) is None:
            raise ConfigError(
                "container_id", f"must be 64 lower-case hex digits, got {self.container_id!r}"
            )


# cgroup v1 hierarchies as a typical node lists them (kernel 5.x), highest first.
# rdma stays at "/": runc before 1.1 never joined it, so real files show that.
_V1_CONTROLLERS = (
    "perf_event",
    "hugetlb",
    "memory",
    "freezer",
    "cpuset",
    "net_cls,net_prio",
    "devices",
    "rdma",
    "blkio",
    "pids",
    "cpu,cpuacct",
    "name=systemd",
)
_V1_AT_ROOT = frozenset({"rdma"})
# Controllers systemd places a login session in; the rest leave it at "/".
_V1_SESSION_CONTROLLERS = frozenset({"name=systemd", "pids", "memory", "cpu,cpuacct"})

_SESSION_PATH = "/user.slice/user-1000.slice/session-1.scope"


def _stable_hex(kind: str, pid: int) -> str:
    return hashlib.sha256(f"capwatch-proctree:{kind}:{pid}".encode()).hexdigest()


def _systemd_pod_path(uid: str, qos: QosClass, prefix: str) -> str:
    """``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice``."""
    levels = [*([prefix] if prefix else []), "kubepods"]
    if qos is not QosClass.GUARANTEED:
        levels.append(qos.value)
    levels.append("pod" + uid.replace("-", "_"))
    slices = ["-".join(levels[: n + 1]) + ".slice" for n in range(len(levels))]
    return "/" + "/".join(slices)


def _cgroupfs_pod_path(uid: str, qos: QosClass, prefix: str) -> str:
    """``/kubepods/burstable/pod<uid>``, below ``prefix`` if given."""
    levels = ["kubepods"]
    if qos is not QosClass.GUARANTEED:
        levels.append(qos.value)
    levels.append("pod" + uid)
    return prefix + "/" + "/".join(levels)


def _container_path(spec: ProcSpec, uid: str) -> str:
    """The full cgroup path of the spec's container."""
    layout = spec.layout
    cid = spec.container_id or _stable_hex("container", spec.pid)
    if layout is CgroupLayout.V2_KIND_SYSTEMD_CONTAINERD:
        return _systemd_pod_path(uid, spec.qos, "kubelet") + f"/cri-containerd-{cid}.scope"
    if layout is CgroupLayout.V1_KIND_CGROUPFS_CONTAINERD:
        node = _stable_hex("node", 0)
        return _cgroupfs_pod_path(uid, spec.qos, f"/docker/{node}/kubelet") + f"/{cid}"
    if layout.is_systemd:
        leaf = f"crio-{cid}.scope" if layout.is_crio else f"cri-containerd-{cid}.scope"
        return _systemd_pod_path(uid, spec.qos, "") + "/" + leaf
    leaf = f"crio-{cid}" if layout.is_crio else cid
    return _cgroupfs_pod_path(uid, spec.qos, "") + "/" + leaf


def cgroup_text(spec: ProcSpec) -> str:
    """The exact content of ``/proc/<pid>/cgroup`` for ``spec``."""
    path = _SESSION_PATH if spec.pod_uid is None else _container_path(spec, spec.pod_uid)
    if not spec.layout.is_v1:
        return f"0::{path}\n"
    lines = []
    for n, controllers in zip(range(len(_V1_CONTROLLERS), 0, -1), _V1_CONTROLLERS, strict=True):
        at_root = controllers in _V1_AT_ROOT or (
            spec.pod_uid is None and controllers not in _V1_SESSION_CONTROLLERS
        )
        at = "/" if at_root else path
        lines.append(f"{n}:{controllers}:{at}")
    # Hybrid hosts mirror systemd's own hierarchy on the unified line; the
    # cgroupfs driver leaves the unified hierarchy alone.
    unified = path if spec.layout.is_systemd or spec.pod_uid is None else "/"
    lines.append(f"0::{unified}")
    return "\n".join(lines) + "\n"


def materialise(root: Path, specs: Iterable[ProcSpec]) -> None:
    """Write ``<root>/<pid>/cgroup`` for every spec; later specs overwrite earlier ones.

    Each file is replaced atomically, so an agent reading the tree while the
    simulator rewrites it never sees half a file.
    """
    for spec in specs:
        directory = root / str(spec.pid)
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / ".cgroup.tmp"
        tmp.write_text(cgroup_text(spec), encoding="utf-8")
        os.replace(tmp, directory / "cgroup")
