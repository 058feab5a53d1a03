"""Process→pod attribution: which Kubernetes pod a PID belongs to.

The kubelet puts every pod in its own cgroup and names that cgroup after the
pod's UID, so ``/proc/<pid>/cgroup`` is enough to map a GPU process to a pod
without asking the container runtime. :func:`pod_uid_from_cgroup` understands
the shapes real nodes produce: cgroup v1 and v2; the systemd and cgroupfs
drivers; every QoS class; containerd and cri-o container cgroups; and nodes
nested in something else (kind, CI runners), where the kubelet's hierarchy sits
below a prefix. Anything that is not a pod's cgroup maps to ``None``.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

DEFAULT_PROC_ROOT = Path("/proc")

_HEX = "[0-9a-fA-F]"
# The five groups of a UUID; the cgroupfs driver joins them with "-", the
# systemd driver with "_" because "-" separates the levels of a slice name.
_UUID_GROUPS = (8, 4, 4, 4, 12)
_DASHED_UUID = re.compile("-".join(f"{_HEX}{{{n}}}" for n in _UUID_GROUPS), re.ASCII)
_UNDERSCORED_UUID = re.compile("_".join(f"{_HEX}{{{n}}}" for n in _UUID_GROUPS), re.ASCII)

_KUBEPODS = "kubepods"
_QOS_LEVELS = frozenset({"burstable", "besteffort"})  # guaranteed pods have no level
# What the kernel prints for the ancestors of the reader's cgroup namespace root:
# everything above it is hidden, so a chain of ancestors may legitimately stop here.
_NAMESPACE_UP = ".."
_SLICE = ".slice"


class ProcRoot(Protocol):
    """Where process information comes from: the host's ``/proc`` or a fake tree."""

    def read_cgroup(self, pid: int) -> str | None:
        """The text of ``<pid>/cgroup``, or None when it cannot be read."""
        ...


class FsProcRoot:
    """Reads ``<root>/<pid>/cgroup`` from a directory laid out like ``/proc``.

    In the DaemonSet the agent runs with ``hostPID``, so ``/proc`` is the host's
    and every GPU process is visible. Tests and the simulator point ``root`` at a
    tree written by :mod:`capwatch.agent.sim.proctree`.
    """

    def __init__(self, root: Path = DEFAULT_PROC_ROOT) -> None:
        self.root = root
        self._prefix = str(root)  # string joins: pathlib costs more than the read here

    def read_cgroup(self, pid: int) -> str | None:
        if pid < 1:  # PIDs start at 1; anything else names no process
            return None
        path = f"{self._prefix}/{pid}/cgroup"
        try:
            # Paths are bytes to the kernel; an undecodable name cannot be a
            # kubelet cgroup, so replacing it keeps the read from failing.
            with open(path, encoding="utf-8", errors="replace") as fh:
                return fh.read()
        except (FileNotFoundError, ProcessLookupError):
            return None  # the process exited between listing and reading: normal
        except OSError as exc:
            # Permission errors (hidepid, LSMs) and the like: the agent cannot tell
            # an unreadable process from a non-Kubernetes one, and neither can be
            # attributed, so both map to None rather than failing the GPU's cycle.
            log.debug("cgroup unreadable pid=%d path=%s error=%s", pid, path, exc)
            return None


def canonical_pod_uid(text: str) -> str | None:
    """``text`` as a canonical pod UID (dashed, lower-case), or None if it is not one."""
    if _DASHED_UUID.fullmatch(text) is None:
        return None
    return text.lower()


@functools.lru_cache(maxsize=4096)
def pod_uid_from_cgroup(text: str) -> str | None:
    """The UID of the pod whose cgroup ``text`` (a ``/proc/<pid>/cgroup``) names.

    Every line ``<hierarchy>:<controllers>:<path>`` is read, v1 and v2 alike.
    Lines whose path names no pod (``/``, ``rdma:/``, a hybrid host's
    ``0::/system.slice/...``) are ignored; every line that does name a pod must
    name the same one, or the answer is None (a process is in one pod only, so
    disagreement means the text cannot be trusted). Never raises.

    Cached by content, not by PID: the answer is a pure function of the text,
    so a reused PID with a new cgroup is parsed afresh.
    """
    found: set[str] = set()
    for line in text.split("\n"):
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[0].isascii() or not parts[0].isdigit():
            continue
        uid = _pod_uid_from_path(parts[2])
        if uid is not None:
            found.add(uid)
    if len(found) == 1:
        return found.pop()
    return None


def _pod_uid_from_path(path: str) -> str | None:
    """The pod UID in one cgroup path, or None.

    When a path holds several pod cgroups (a Kubernetes node running inside a pod
    of another cluster), the deepest belongs to the kubelet nearest the process,
    which is the one whose pods this agent sees.
    """
    if not path.startswith("/"):
        return None
    segments = [s for s in path.split("/") if s]
    uid: str | None = None
    for i, segment in enumerate(segments):
        if "pod" not in segment:  # cheap filter: most segments name no pod
            continue
        found = _systemd_pod(segments, i) or _cgroupfs_pod(segments, i)
        if found is not None:
            uid = found
    return uid


def _systemd_pod(segments: list[str], i: int) -> str | None:
    """``segments[i]`` as a systemd pod slice, e.g. ``kubepods-burstable-pod<uid>.slice``.

    systemd names a slice after its whole ancestry (``a-b-c.slice`` lives in
    ``a-b.slice``, which lives in ``a.slice``), so the visible ancestors must be
    exactly those. A prefix is allowed before ``kubepods`` (kind runs the kubelet
    with ``--cgroup-root=/kubelet``, giving ``kubelet-kubepods-...``); only a QoS
    level may come after it.
    """
    segment = segments[i]
    if not segment.endswith(_SLICE):
        return None
    stem, sep, uid_part = segment[: -len(_SLICE)].rpartition("-pod")
    if not sep or _UNDERSCORED_UUID.fullmatch(uid_part) is None:
        return None
    levels = stem.split("-")
    if "" in levels:
        return None
    if levels[-1] != _KUBEPODS and not (
        len(levels) >= 2 and levels[-2] == _KUBEPODS and levels[-1] in _QOS_LEVELS
    ):
        return None
    expected = ["-".join(levels[: n + 1]) + _SLICE for n in range(len(levels))]
    if not _ancestors_match(segments[:i], expected):
        return None
    return uid_part.replace("_", "-").lower()


def _cgroupfs_pod(segments: list[str], i: int) -> str | None:
    """``segments[i]`` as a cgroupfs pod directory, e.g. ``kubepods/burstable/pod<uid>``."""
    segment = segments[i]
    if not segment.startswith("pod"):
        return None
    uid = canonical_pod_uid(segment[len("pod") :])
    if uid is None:
        return None
    parent = segments[i - 1] if i > 0 else None
    expected = [_KUBEPODS, parent] if parent in _QOS_LEVELS else [_KUBEPODS]
    if not _ancestors_match(segments[:i], expected):
        return None
    return uid


def _ancestors_match(before: list[str], expected: list[str]) -> bool:
    """Whether the segments just before a pod cgroup are ``expected``'s tail.

    All of ``expected`` must be visible, unless the cgroup namespace boundary
    (``..``) hides the outer part; whatever precedes the chain is free (the
    kubelet's cgroup root, or the container a nested node runs in).
    """
    for offset, want in enumerate(reversed(expected), start=1):
        if offset > len(before):
            return False
        have = before[-offset]
        if have == _NAMESPACE_UP:
            return True
        if have != want:
            return False
    return True


class Attributor:
    """Maps PIDs to pod UIDs by reading their cgroups.

    Nothing is cached: PIDs are reused, and a cached answer for a PID that a
    new process now holds would attribute that process to the wrong pod.
    """

    def __init__(self, proc_root: ProcRoot) -> None:
        self._proc_root = proc_root

    def pod_uid(self, pid: int) -> str | None:
        """The UID of the pod ``pid`` runs in; None for a non-Kubernetes or gone process."""
        text = self._proc_root.read_cgroup(pid)
        if text is None:
            return None
        uid = pod_uid_from_cgroup(text)
        if uid is None:
            log.debug("not in a pod cgroup pid=%d", pid)
        return uid

    def pod_uids(self, pids: Iterable[int]) -> dict[int, str | None]:
        """:meth:`pod_uid` for each PID, keyed by PID."""
        return {pid: self.pod_uid(pid) for pid in pids}
