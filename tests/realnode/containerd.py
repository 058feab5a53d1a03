"""The real node's container runtime: a private containerd (OS package) with runc.

A containerd of the node's own, never the host's: its root, state, socket and
CNI configuration are under the node's directories, so ``down`` can remove all
of it. Two runtime handlers, as on a GPU node: ``runc`` (the default) and
``nvidia``, which stands in for the NVIDIA container toolkit. The toolkit
mounts the driver's ``libnvidia-ml.so.1`` into a container that asks for it;
here the ``nvidia`` handler's base OCI spec bind-mounts the fake NVML library
(tests/fakenvml) at the same path, with its configuration directory, so a pod
with ``runtimeClassName: nvidia`` finds NVML exactly where it would on a GPU
node and nothing in the chart or the image knows the difference.

Settings that differ from a stock install, and why:

- ``restrict_oom_score_adj``: this host's processes run with an OOM score
  adjustment the kubelet's pods may not go below (the rootless-style clamp).
- ``sandbox_image``: the static pause image built here (images.py).
- the overlayfs snapshotter; runc with cgroupfs (no systemd on this host).
"""

from __future__ import annotations

import copy
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

LIBNVML_PATH = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
FAKENVML_DIR = "/run/capwatch-fakenvml"
FAKENVML_CONFIG = f"{FAKENVML_DIR}/config"
NVIDIA_HANDLER = "nvidia"
NAMESPACE = "k8s.io"


class ContainerdError(Exception):
    """containerd could not be configured, reached or told something; one line."""


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Where one node's containerd keeps everything."""

    root: Path
    state: Path
    socket: Path
    config: Path
    cni_conf_dir: Path
    nvidia_spec: Path

    @classmethod
    def under(cls, directory: Path, run: Path) -> Layout:
        """Files under directory; the socket and state under run (short unix socket paths)."""
        return cls(
            root=directory / "containerd" / "root",
            state=run / "containerd",
            socket=run / "containerd.sock",
            config=directory / "containerd" / "config.toml",
            cni_conf_dir=directory / "cni" / "net.d",
            nvidia_spec=directory / "containerd" / "nvidia-spec.json",
        )


def config_toml(layout: Layout, *, sandbox_image: str, cni_bin_dir: str) -> str:
    """containerd 1.6's config (version 2) for the node."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    runtimes = f"{cri}.containerd.runtimes"
    return f"""\
version = 2
root = "{layout.root}"
state = "{layout.state}"
# Snapshotters this host cannot use, off so that they do not log at every start.
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
]

[grpc]
  address = "{layout.socket}"

[ttrpc]
  address = "{layout.socket}.ttrpc"

[{cri}]
  sandbox_image = "{sandbox_image}"
  restrict_oom_score_adj = true
  enable_selinux = false

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{runtimes}.runc]
  runtime_type = "io.containerd.runc.v2"

[{runtimes}.runc.options]
  SystemdCgroup = false

[{runtimes}.{NVIDIA_HANDLER}]
  runtime_type = "io.containerd.runc.v2"
  base_runtime_spec = "{layout.nvidia_spec}"

[{runtimes}.{NVIDIA_HANDLER}.options]
  SystemdCgroup = false

[{cri}.cni]
  bin_dir = "{cni_bin_dir}"
  conf_dir = "{layout.cni_conf_dir}"
"""


def default_spec() -> dict[str, object]:
    """containerd's default OCI spec (``ctr oci spec``): the base every handler starts from."""
    done = subprocess.run(["ctr", "oci", "spec"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ContainerdError(f"ctr oci spec failed: {done.stderr.strip()}")
    spec: dict[str, object] = json.loads(done.stdout)
    return spec


def nvidia_spec(base: dict[str, object], *, library: Path, fakenvml_dir: Path) -> dict[str, object]:
    """base plus what the NVIDIA toolkit would add: NVML mounted, and where its config is.

    FAKE_NVML_CONFIG tells the fake library which file configures it (devices,
    processes, faults); a real NVML has no such variable and ignores it.
    """
    spec = copy.deepcopy(base)
    mounts = list(spec.get("mounts", []))  # type: ignore[call-overload]
    mounts += [
        {
            "destination": LIBNVML_PATH,
            "type": "bind",
            "source": str(library),
            "options": ["rbind", "ro", "nosuid", "nodev"],
        },
        {
            "destination": FAKENVML_DIR,
            "type": "bind",
            "source": str(fakenvml_dir),
            "options": ["rbind", "rw", "nosuid", "nodev"],
        },
    ]
    spec["mounts"] = mounts
    process = dict(spec.get("process", {}))  # type: ignore[call-overload]
    process["env"] = [*process.get("env", []), f"FAKE_NVML_CONFIG={FAKENVML_CONFIG}"]
    spec["process"] = process
    return spec


def ctr(layout: Layout, *args: str, timeout: float = 60.0) -> str:
    """``ctr`` against this node's containerd, in the kubelet's namespace; its stdout."""
    command = ["ctr", "--address", str(layout.socket), "--namespace", NAMESPACE, *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise ContainerdError(f"ctr {' '.join(args)} did not answer in {timeout:.0f}s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise ContainerdError(f"ctr {' '.join(args)} failed: {last}")
    return done.stdout


def import_archive(layout: Layout, archive: Path) -> None:
    """Import an OCI archive, unpacked for the overlayfs snapshotter (kubelet-visible)."""
    ctr(layout, "images", "import", "--snapshotter", "overlayfs", str(archive), timeout=300.0)


def images(layout: Layout) -> set[str]:
    """The image names this containerd holds in the kubelet's namespace."""
    lines = ctr(layout, "images", "list", "--quiet").splitlines()
    return {line.strip() for line in lines if line.strip()}


def tasks(layout: Layout) -> dict[str, int]:
    """Running tasks (container id -> pid) in the kubelet's namespace."""
    found: dict[str, int] = {}
    for line in ctr(layout, "tasks", "list").splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 2 and fields[1].isdigit():
            found[fields[0]] = int(fields[1])
    return found


def containers(layout: Layout) -> list[str]:
    """Every container (sandboxes included) in the kubelet's namespace."""
    return [line.strip() for line in ctr(layout, "containers", "list", "--quiet").splitlines()]


def _best_effort(layout: Layout, *args: str) -> None:
    """ctr args, whatever it answers (the thing may be gone already)."""
    subprocess.run(
        ["ctr", "--address", str(layout.socket), "--namespace", NAMESPACE, *args],
        capture_output=True,
        timeout=30,
        check=False,
    )


def force_remove_all(layout: Layout) -> None:
    """Kill and delete every task and container: what is left after the kubelet stopped."""
    for container in tasks(layout):
        _best_effort(layout, "tasks", "kill", "--signal", "SIGKILL", container)
    for container in containers(layout):
        _best_effort(layout, "tasks", "delete", "--force", container)
        _best_effort(layout, "containers", "delete", container)
