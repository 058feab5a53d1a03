"""A real Kubernetes node on this host: the control plane, containerd, runc, a kubelet.

    node = RealNode(directory, binaries=..., image_archive=..., fakenvml=...)
    node.up()          # control plane, pod network, containerd, images, kubelet; Node Ready
    ...                # helm install -f node.values_path; KUBECONFIG=node.kubeconfig
    node.down()        # everything stopped and removed; raises if anything is left

``up`` starts, in order: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler (tests/realkube's ControlPlane, in DIR), the pod network
(network.py), containerd with runc (containerd.py), imports the pause image
and capwatch's image, then the kubelet (kubelet.py), and returns once the
Node is Ready. It writes DIR/kubeconfig (admin) and DIR/values.yaml (the chart
values that install the imported image on this node) and DIR/node.json (what
``down`` reads, from this process or another).

``down`` stops the kubelet, kills every container, stops containerd, then
removes what they left on the host: mounts, network namespaces, the bridge,
iptables chains, pod cgroups, the kubelet's and containerd's directories,
/var/lib/capwatch when this node made it; then stops the control plane. It
ends by looking for each of those again, and raises NodeError naming any
leftover. Only one node runs on a host at a time (they would share the pod
cgroups): HOST_STATE names the running one, and ``up`` over a node whose
processes died first cleans up after it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.realkube import processes
from tests.realkube.access import ApiError
from tests.realkube.controlplane import ControlPlane, ControlPlaneError, ensure_writable
from tests.realkube.pki import Pki
from tests.realkube.ports import free_ports
from tests.realkube.processes import Proc, ProcessError
from tests.realnode import containerd, host, images, network
from tests.realnode import kubelet as kubelet_config
from tests.realnode.kubelet import KubeletPaths

NODE_NAME = "realnode"
NODE_STATE = "node.json"
VALUES = "values.yaml"
# One node per host: the file that says which directory holds it.
HOST_STATE = Path("/run/capwatch-realnode/node")
# The chart's default state hostPath: the node never uses it (each release gets its own
# under the node's directory), so a record left there by anything else cannot leak in.
CAPWATCH_STATE = Path("/var/lib/capwatch")
# Where containerd's CNI library caches each pod's result (not configurable in 1.6).
CNI_CACHE = Path("/var/lib/cni")
# The kubelet's device-plugin socket directory is fixed at /var/lib/kubelet/device-plugins
# whatever --root-dir says (pluginapi.DevicePluginPath).
KUBELET_FIXED = Path("/var/lib/kubelet")
NODE_READY_S = 120.0
CONTAINERD_READY_S = 30.0
POLL_S = 0.25


class NodeError(Exception):
    """The node could not be brought up or fully taken down; the first line says why."""


def run_dir(directory: Path) -> Path:
    """A short directory for sockets and runtime state (unix socket paths are short)."""
    digest = hashlib.sha256(str(directory).encode()).hexdigest()[:10]
    return Path("/run/capwatch-realnode") / digest


class RealNode:
    """One node, in directory; tie_to_parent as for tests/realkube's processes."""

    def __init__(
        self,
        directory: Path,
        *,
        binaries: Mapping[str, Path] | None = None,
        image_archive: Path | None = None,
        fakenvml: Path | None = None,
        tie_to_parent: bool = True,
    ) -> None:
        self.directory = Path(directory).resolve()
        self._binaries = dict(binaries or {})
        self._image_archive = image_archive
        self._fakenvml = fakenvml
        self._tie = tie_to_parent
        self.run = run_dir(self.directory)
        self.runtime = containerd.Layout.under(self.directory, self.run)
        self.plane = ControlPlane(
            self.directory,
            binaries=self._binaries,
            tie_to_parent=tie_to_parent,
            apiserver_args=self._kubelet_client_args(),
        )
        self.kubelet_paths = KubeletPaths.under(self.directory, client_ca=self.plane.pki.ca.cert)
        self.node_name = NODE_NAME
        self.image_reference: str | None = None
        self._procs: list[Proc] = []
        self._made_cni_cache = False
        self._made_kubelet_fixed = False
        self._popens: dict[int, subprocess.Popen[bytes]] = {}
        self._netns_before: set[str] = set()

    # -- where things are ---------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        return self.plane.kubeconfig

    @property
    def values_path(self) -> Path:
        return self.directory / VALUES

    @property
    def fakenvml_dir(self) -> Path:
        """Mounted into `nvidia` runtime containers at containerd.FAKENVML_DIR."""
        return self.directory / "fakenvml"

    @property
    def logs(self) -> Path:
        return self.plane.logs

    def state_dir(self, release: str) -> Path:
        """The release's ownership-record hostPath (the chart's agent.stateHostPath):
        its own, so that one release's record never reaches another's agents."""
        return self.directory / "state" / release

    @property
    def pod_logs(self) -> Path:
        """The kubelet's container logs: NAMESPACE_POD_UID/CONTAINER/RESTART.log."""
        return self.directory / "pod-logs"

    def _kubelet_client_args(self) -> list[str]:
        # The API server's own client identity at kubelets (logs, exec): the admin pair.
        admin = Pki.at(self.directory / "pki").admin
        return [f"--kubelet-client-certificate={admin.cert}", f"--kubelet-client-key={admin.key}"]

    # -- up -----------------------------------------------------------------------------

    def up(self) -> RealNode:
        host.check()
        ensure_writable(self.directory)
        self._take_host()
        try:
            self._netns_before = {str(path) for path in host.netns_mounts()}
            self._made_cni_cache = not CNI_CACHE.exists()
            self._made_kubelet_fixed = not KUBELET_FIXED.exists()
            self.plane.start()
            self.plane.start_controller_manager()
            self.plane.start_scheduler()
            assert self.plane.ports is not None
            network.create(self.plane.ports.apiserver)
            self._save()
            self._start_containerd()
            self._import_images()
            self._start_kubelet()
            self._create_runtime_class()
            self._write_values()
            self._save()
        except BaseException:
            with contextlib.suppress(NodeError):
                self.down()
            raise
        return self

    def _take_host(self) -> None:
        """Claim the host for this node, cleaning up after a dead one; refuse a live one."""
        with contextlib.suppress(FileNotFoundError):
            other = Path(HOST_STATE.read_text(encoding="utf-8").strip())
            previous = RealNode.attach(other) if (other / NODE_STATE).is_file() else None
            if previous is not None and previous.alive():
                raise NodeError(f"a real node is already up in {other}: down --dir {other} first")
            if previous is not None:
                previous.down()
        if network.bridge_exists():
            raise NodeError(f"network device {network.BRIDGE} exists: another node is up")
        HOST_STATE.parent.mkdir(parents=True, exist_ok=True)
        HOST_STATE.write_text(f"{self.directory}\n", encoding="utf-8")

    def _spawn(self, name: str, argv: list[str]) -> tuple[subprocess.Popen[bytes], Proc]:
        log = self.logs / f"{name}.log"
        log.unlink(missing_ok=True)
        try:
            popen, proc = processes.spawn(name, argv, log, tie_to_parent=self._tie)
        except ProcessError as err:
            raise NodeError(str(err)) from None
        self._procs.append(proc)
        self._popens[proc.pid] = popen
        self._save()
        return popen, proc

    def _wait(
        self,
        popen: subprocess.Popen[bytes],
        proc: Proc,
        ready: Callable[[], bool],
        what: str,
        timeout: float,
    ) -> None:
        """Poll ready() until it holds; NodeError with proc's log tail if it dies or times out."""
        deadline = time.monotonic() + timeout
        while not ready():
            if popen.poll() is not None:
                raise NodeError(
                    f"{proc.name} exited ({popen.returncode}) before {what}; log {proc.log}:\n"
                    + processes.tail(proc.log, 25)
                )
            if time.monotonic() > deadline:
                raise NodeError(
                    f"{proc.name} not {what} within {timeout:.0f}s; log {proc.log}:\n"
                    + processes.tail(proc.log, 25)
                )
            time.sleep(POLL_S)

    def _start_containerd(self) -> None:
        layout = self.runtime
        for path in (layout.root, layout.state, layout.config.parent):
            path.mkdir(parents=True, exist_ok=True)
        self.fakenvml_dir.mkdir(parents=True, exist_ok=True)
        (self.fakenvml_dir / "config").touch()
        library = self._fakenvml / "libnvidia-ml.so.1" if self._fakenvml else None
        if library is None or not library.is_file():
            raise NodeError(
                f"no fake libnvidia-ml.so.1 in {self._fakenvml} (tests/fakenvml/build.py)"
            )
        spec = containerd.nvidia_spec(
            containerd.default_spec(), library=library, fakenvml_dir=self.fakenvml_dir
        )
        layout.nvidia_spec.write_text(json.dumps(spec, indent=2), encoding="utf-8")
        network.write_cni_config(layout.cni_conf_dir, self.directory / "cni" / "ipam")
        layout.config.write_text(
            containerd.config_toml(
                layout, sandbox_image=images.PAUSE_IMAGE, cni_bin_dir=host.CNI_BIN_DIR
            ),
            encoding="utf-8",
        )
        popen, proc = self._spawn("containerd", ["containerd", "--config", str(layout.config)])
        self._wait(popen, proc, self._containerd_answers, "answering", CONTAINERD_READY_S)

    def _containerd_answers(self) -> bool:
        try:
            containerd.ctr(self.runtime, "version", timeout=5.0)
        except containerd.ContainerdError:
            return False
        return True

    def _import_images(self) -> None:
        containerd.import_archive(self.runtime, images.pause_archive(self.directory / "images"))
        if self._image_archive is None:
            raise NodeError("no capwatch image archive: make image")
        containerd.import_archive(self.runtime, self._image_archive)
        self.image_reference = images.archive_reference(self._image_archive)
        held = containerd.images(self.runtime)
        for wanted in (images.PAUSE_IMAGE, self.image_reference):
            if wanted not in held:
                raise NodeError(f"containerd did not import {wanted}: it holds {sorted(held)}")

    def _start_kubelet(self) -> None:
        paths = self.kubelet_paths
        self.plane.component_kubeconfig(
            "kubelet", f"system:node:{self.node_name}", ("system:nodes",)
        )
        port, healthz = free_ports(2)
        document = kubelet_config.configuration(
            paths,
            runtime_socket=self.runtime.socket,
            address=network.GATEWAY,
            port=port,
            healthz_port=healthz,
        )
        kubelet_config.write_configuration(paths, document)
        argv = kubelet_config.argv(
            self.plane.binary("kubelet"), paths, node_name=self.node_name, node_ip=network.GATEWAY
        )
        popen, proc = self._spawn("kubelet", argv)
        self._wait(popen, proc, self.node_ready, f"Node {self.node_name} Ready", NODE_READY_S)

    def node(self) -> dict[str, Any]:
        result: dict[str, Any] = self.plane.request("GET", f"/api/v1/nodes/{self.node_name}")
        return result

    def node_ready(self) -> bool:
        try:
            conditions = self.node().get("status", {}).get("conditions", [])
        except ApiError:
            return False
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def _create_runtime_class(self) -> None:
        """The RuntimeClass a GPU operator installs, for containerd's `nvidia` handler."""
        body = {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": containerd.NVIDIA_HANDLER},
            "handler": containerd.NVIDIA_HANDLER,
        }
        self.plane.request("POST", "/apis/node.k8s.io/v1/runtimeclasses", body)

    def values(self) -> dict[str, Any]:
        """The chart values that install the imported image on this node."""
        assert self.image_reference is not None
        repository, _, tag = self.image_reference.rpartition(":")
        return {
            "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
            # The record under the node's directory, removed with it (tests give each
            # release its own: Cluster.install).
            "agent": {"gpuBackend": "sim", "stateHostPath": str(self.state_dir("capwatch"))},
            # As on a GPU node whose containerd has the NVIDIA runtime beside runc:
            # it mounts NVML (here the fake one) into the agent for gpuBackend nvml.
            "runtimeClassName": containerd.NVIDIA_HANDLER,
        }

    def _write_values(self) -> None:
        header = (
            f"# The capwatch chart on the real node {self.node_name} (scripts/realnode.py):\n"
            "# the image imported into its containerd (no registry: never pulled), the sim\n"
            "# backend (no GPU here; gpuBackend: nvml finds the fake NVML through the\n"
            "# nvidia runtime class), the ownership record under the node's directory.\n"
            "# Everything else is the chart's default.\n"
        )
        text = header + yaml.safe_dump(self.values(), sort_keys=False)
        self.values_path.write_text(text, encoding="utf-8")

    # -- state --------------------------------------------------------------------------

    def _save(self) -> None:
        state = {
            "processes": [proc.to_json() for proc in self._procs],
            "made_cni_cache": self._made_cni_cache,
            "made_kubelet_fixed": self._made_kubelet_fixed,
            "netns_before": sorted(self._netns_before),
            "image_reference": self.image_reference,
        }
        path = self.directory / NODE_STATE
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
        temporary.replace(path)

    @classmethod
    def attach(cls, directory: Path) -> RealNode:
        """The node whose node.json is in directory (brought up by another process)."""
        path = Path(directory) / NODE_STATE
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
            procs = [Proc.from_json(entry) for entry in state["processes"]]
        except FileNotFoundError:
            raise NodeError(f"no real node in {directory} ({path})") from None
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise NodeError(f"unreadable node state {path}: {err}") from None
        node = cls(directory, tie_to_parent=False)
        node._procs = procs
        node._made_cni_cache = bool(state.get("made_cni_cache"))
        node._made_kubelet_fixed = bool(state.get("made_kubelet_fixed"))
        node._netns_before = set(state.get("netns_before", []))
        node.image_reference = state.get("image_reference")
        with contextlib.suppress(ControlPlaneError):
            node.plane = ControlPlane.attach(node.directory)
        return node

    def alive(self) -> list[Proc]:
        """This node's processes (control plane's too) still running."""
        return [proc for proc in (*self._procs, *self.plane.processes) if processes.alive(proc)]

    # -- down ---------------------------------------------------------------------------

    def down(self) -> None:
        """Stop everything and remove what it left; NodeError naming any leftover."""
        failures: list[str] = []
        kubelet = [proc for proc in self._procs if proc.name == "kubelet"]
        for proc in kubelet:
            failures += self._stop(proc)
        if self.runtime.socket.exists() and self._containerd_answers():
            with contextlib.suppress(containerd.ContainerdError):
                containerd.force_remove_all(self.runtime)
        for proc in self._procs:
            if proc.name != "kubelet":
                failures += self._stop(proc)
        # containerd's shims outlive it by design (containers survive its restarts).
        host.kill(host.processes_with(str(self.runtime.socket)))
        failures += host.remove_cgroups()
        pinned = [path for path in host.netns_mounts() if str(path) not in self._netns_before]
        failures += host.unmount([*host.mounts_under([self.directory, self.run]), *pinned])
        for path in pinned:
            path.unlink(missing_ok=True)
        failures += network.remove()
        try:
            self.plane.stop()
        except ControlPlaneError as err:
            failures.append(str(err).splitlines()[0])
        for tree in (
            self.directory / "kubelet",
            self.directory / "containerd",
            self.pod_logs,
            self.run,
            self.directory / "state",
            *([CNI_CACHE] if self._made_cni_cache else []),
            *([KUBELET_FIXED] if self._made_kubelet_fixed else []),
        ):
            failures += host.remove_tree(tree)
        for cached in CNI_CACHE.glob(f"results/{network.NETWORK_NAME}-*"):
            cached.unlink(missing_ok=True)
        with contextlib.suppress(FileNotFoundError):
            if HOST_STATE.read_text(encoding="utf-8").strip() == str(self.directory):
                HOST_STATE.unlink()
        failures += self.leftovers()
        self._procs = [proc for proc in self._procs if processes.alive(proc)]
        self._save()
        if failures:
            unique = list(dict.fromkeys(failures))
            raise NodeError(f"the node left {len(unique)} thing(s) behind: {'; '.join(unique)}")
        (self.directory / NODE_STATE).unlink(missing_ok=True)

    def _stop(self, proc: Proc) -> list[str]:
        try:
            # With its Popen when this process started it: stopped and reaped.
            processes.stop(proc, self._popens.pop(proc.pid, None), grace=15.0)
        except ProcessError as err:
            return [str(err)]
        return []

    def leftovers(self) -> list[str]:
        """Anything of this node still on the host (empty after a clean down)."""
        found = [f"process {proc.name} ({proc.pid})" for proc in self.alive()]
        found += [
            f"process {pid} (a containerd shim)"
            for pid in host.processes_with(str(self.runtime.socket))
        ]
        found += [f"process {pid} (in a pod cgroup)" for pid in host.cgroup_pids()]
        found += [f"mount {point}" for point in host.mounts_under([self.directory, self.run])]
        found += [
            f"mount {path}" for path in host.netns_mounts() if str(path) not in self._netns_before
        ]
        found += [f"cgroup {path}" for path in host.kubepods_dirs()]
        found += network.leftovers()
        for tree in (
            self.directory / "kubelet",
            self.directory / "containerd",
            self.directory / "state",
            self.run,
        ):
            if tree.exists():
                found.append(f"directory {tree}")
        for made, path in (
            (self._made_cni_cache, CNI_CACHE),
            (self._made_kubelet_fixed, KUBELET_FIXED),
        ):
            if made and path.exists():
                found.append(f"directory {path}")
        found += [f"file {path}" for path in CNI_CACHE.glob(f"results/{network.NETWORK_NAME}-*")]
        return found
