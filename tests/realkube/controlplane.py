"""A real etcd + kube-apiserver on 127.0.0.1, for tests and benches.

    from tests.realkube.controlplane import ControlPlane

    with ControlPlane(tmp_path).start() as cp:
        cp.request("GET", "/api/v1/namespaces")          # as admin (system:masters)
        token = cp.token("default", "reader")           # a ServiceAccount token
        config = cp.token_configuration(token)          # kubernetes.client.Configuration

Everything listens on loopback only, on ports found free by binding port 0 on
127.0.0.1. The API server runs with the flags envtest (controller-runtime's
pkg/internal/testing/controlplane) uses, plus what these tests need: Node,RBAC
authorization, a client CA (the admin kubeconfig is a client certificate), and
a service-account signing key and issuer, so the TokenRequest API mints tokens.

kube-controller-manager, kube-scheduler and KWOK (fake nodes that stay Ready,
fake pods that go Running with IPs from their node's podCIDR) are optional:
:meth:`ControlPlane.start_controller_manager`, :meth:`start_scheduler`,
:meth:`start_kwok`.

The binaries come from scripts/build_kube.py's cache (built on first use when
none are passed in). The directory holds pki/, etcd/, logs/, kubeconfig and
state.json (what ``scripts/realkube.py down`` reads).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType, TracebackType

from tests.loadfile import load_module
from tests.realkube import flags, kubeconfig, processes
from tests.realkube.access import ApiAccess, ApiError
from tests.realkube.flags import (
    CLUSTER_CIDR,
    KWOK_DEFAULT_CIDR,
    KWOK_NODE_SELECTOR,
    LOOPBACK,
)
from tests.realkube.pki import Pki
from tests.realkube.ports import PortError, Ports, free_port
from tests.realkube.processes import Proc, ProcessError

ROOT = Path(__file__).resolve().parents[2]
STATE_FILE = "state.json"
POLL_S = 0.1
LOG_TAIL_LINES = 25
COMPONENT_START_S = 60.0


class ControlPlaneError(Exception):
    """The control plane could not be started or reached.

    The first line of the message says what failed (the CLI prints only it);
    later lines, when present, are the tail of the failing process's log.
    """


def build_kube() -> ModuleType:
    """scripts/build_kube.py as a module (scripts/ is not a package)."""
    try:
        return load_module("capwatch_build_kube", ROOT / "scripts" / "build_kube.py")
    except ImportError as err:
        raise ControlPlaneError(str(err)) from None


def ensure_writable(directory: Path) -> Path:
    """directory, created if need be, once a file can be written in it."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as err:
        raise ControlPlaneError(
            f"{directory} is not a writable directory: {err.strerror or err}"
        ) from None
    return directory.resolve()


class ControlPlane(ApiAccess):
    """etcd and kube-apiserver (and optional components) under one directory.

    tie_to_parent=True (the default, for tests) makes every process die with
    the Python process that started it; ``scripts/realkube.py up`` passes
    False so that they run on after it exits.
    """

    def __init__(
        self,
        directory: Path,
        *,
        binaries: Mapping[str, Path] | None = None,
        apiserver_port: int | None = None,
        etcd_port: int | None = None,
        tie_to_parent: bool = True,
        start_timeout: float = 60.0,
        disable_admission_plugins: Sequence[str] = ("ServiceAccount",),
        apiserver_args: Sequence[str] = (),
    ) -> None:
        self.directory = Path(directory)
        self._binaries = dict(binaries) if binaries is not None else None
        self._wanted_ports = (apiserver_port, etcd_port)
        self._tie = tie_to_parent
        self._start_timeout = start_timeout
        # envtest disables ServiceAccount admission: without kube-controller-manager
        # no `default` ServiceAccount exists, and the plugin rejects every pod.
        self._disabled_admission = tuple(disable_admission_plugins)
        self._apiserver_args = tuple(apiserver_args)
        self._started: list[tuple[Proc, subprocess.Popen[bytes] | None]] = []
        self._contexts: dict[str, ssl.SSLContext] = {}
        self.ports: Ports | None = None
        self.pki = Pki.at(self.directory / "pki")
        self.startup_seconds: float | None = None

    # -- where things are -------------------------------------------------------------

    @property
    def url(self) -> str:
        """https://127.0.0.1:PORT, the API server."""
        if self.ports is None:
            raise ControlPlaneError("the control plane has not been started")
        return f"https://{LOOPBACK}:{self.ports.apiserver}"

    @property
    def ca_path(self) -> Path:
        """The CA certificate that signed the API server's serving certificate."""
        return self.pki.ca.cert

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (CN admin, O system:masters)."""
        return self.directory / "kubeconfig"

    @property
    def logs(self) -> Path:
        return self.directory / "logs"

    @property
    def processes(self) -> tuple[Proc, ...]:
        """Every process started and not yet stopped, in start order."""
        return tuple(proc for proc, _ in self._started)

    def binary(self, name: str) -> Path:
        """The path of one binary, building them all first if none were given."""
        if self._binaries is None:
            try:
                self._binaries = build_kube().ensure_binaries()
            except build_kube().BuildError as err:
                raise ControlPlaneError(str(err)) from None
        path = self._binaries.get(name)
        if path is None or not path.is_file():
            raise ControlPlaneError(f"missing binary: {name} (looked for {path})")
        return path

    # -- starting and stopping --------------------------------------------------------

    def start(self) -> ControlPlane:
        """Start etcd, then kube-apiserver; return once /readyz says ok."""
        if self._started:
            raise ControlPlaneError("this control plane is already started")
        began = time.monotonic()
        ensure_writable(self.directory)
        # Ports before binaries: a busy port is reported at once, not after a build.
        try:
            self.ports = Ports.free(*self._wanted_ports)
        except PortError as err:
            raise ControlPlaneError(str(err)) from None
        etcd, apiserver = self.binary("etcd"), self.binary("kube-apiserver")
        self.pki = Pki.create(self.directory / "pki")
        try:
            self._start_etcd(etcd)
            self._start_apiserver(apiserver)
        except BaseException:
            self.stop()
            raise
        admin = kubeconfig.client_credentials(self.pki.admin)
        kubeconfig.write_private(
            self.kubeconfig, kubeconfig.render(self.url, self.ca_path, "admin", admin)
        )
        self.save_state()
        self.startup_seconds = time.monotonic() - began
        return self

    def stop(self, grace: float = 10.0) -> None:
        """Stop every process, last started first; return when none is left."""
        errors = []
        while self._started:
            proc, popen = self._started.pop()
            try:
                processes.stop(proc, popen, grace=grace)
            except ProcessError as err:
                errors.append(str(err))
        self._contexts.clear()
        if errors:
            # state.json stays: it still names the survivors for another `down`.
            raise ControlPlaneError("; ".join(errors))
        with contextlib.suppress(FileNotFoundError):
            (self.directory / STATE_FILE).unlink()

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _spawn(self, name: str, argv: list[str]) -> tuple[Proc, subprocess.Popen[bytes]]:
        log = self.logs / f"{name}.log"
        log.unlink(missing_ok=True)
        try:
            popen, proc = processes.spawn(name, argv, log, tie_to_parent=self._tie)
        except ProcessError as err:
            raise ControlPlaneError(str(err)) from None
        self._started.append((proc, popen))
        return proc, popen

    def _wait(
        self,
        proc: Proc,
        popen: subprocess.Popen[bytes],
        ready: Callable[[], bool],
        what: str,
        timeout: float,
    ) -> None:
        """Poll ready() until it holds; fail with the log's tail if proc dies or time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            code = popen.poll()
            if code is not None:
                raise ControlPlaneError(
                    f"{proc.name} exited with status {code} before {what}; "
                    f"log {proc.log}:\n{processes.tail(proc.log, LOG_TAIL_LINES)}"
                )
            if ready():
                return
            if time.monotonic() >= deadline:
                raise ControlPlaneError(
                    f"{proc.name} did not get to {what} within {timeout:.0f}s; "
                    f"log {proc.log}:\n{processes.tail(proc.log, LOG_TAIL_LINES)}"
                )
            time.sleep(POLL_S)

    def _start_etcd(self, binary: Path) -> None:
        assert self.ports is not None
        data = self.directory / "etcd"
        # A fresh cluster each start: old objects would outlive the PKI they were made with.
        shutil.rmtree(data, ignore_errors=True)
        argv = flags.etcd_argv(binary, data, self.ports.etcd_client, self.ports.etcd_peer)
        proc, popen = self._spawn("etcd", argv)
        client = f"http://{LOOPBACK}:{self.ports.etcd_client}"
        self._wait(proc, popen, lambda: self._etcd_healthy(client), "answering /health", 30.0)

    @staticmethod
    def _etcd_healthy(client: str) -> bool:
        try:
            with urllib.request.urlopen(f"{client}/health", timeout=2) as response:  # noqa: S310
                body = json.loads(response.read())
        except (OSError, ValueError):
            return False
        return bool(body.get("health") == "true")

    def apiserver_argv(self, binary: Path) -> list[str]:
        """kube-apiserver's command line (see flags.apiserver_argv)."""
        assert self.ports is not None
        return flags.apiserver_argv(
            binary,
            self.pki,
            etcd_port=self.ports.etcd_client,
            port=self.ports.apiserver,
            disabled_admission=self._disabled_admission,
            extra=self._apiserver_args,
        )

    def _start_apiserver(self, binary: Path) -> None:
        proc, popen = self._spawn("kube-apiserver", self.apiserver_argv(binary))
        self._wait(proc, popen, self.ready, "/readyz answering ok", self._start_timeout)

    def ready(self) -> bool:
        """Whether /readyz answers ok right now."""
        try:
            return self.request_text("GET", "/readyz", timeout=2.0) == "ok"
        except (OSError, ApiError):
            return False

    # -- the state file, for a control plane that outlives its starter -----------------

    def save_state(self) -> Path:
        """Write DIR/state.json: enough for another process to find and stop this one."""
        assert self.ports is not None
        state = {
            "url": self.url,
            "ca": str(self.ca_path),
            "kubeconfig": str(self.kubeconfig),
            "ports": {
                "apiserver": self.ports.apiserver,
                "etcd_client": self.ports.etcd_client,
                "etcd_peer": self.ports.etcd_peer,
            },
            "processes": [proc.to_json() for proc in self.processes],
        }
        path = self.directory / STATE_FILE
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
        temporary.replace(path)
        return path

    @classmethod
    def attach(cls, directory: Path) -> ControlPlane:
        """The control plane whose state.json is in directory (started by another process)."""
        path = Path(directory) / STATE_FILE
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
            ports = Ports(**state["ports"])
            procs = [Proc.from_json(entry) for entry in state["processes"]]
        except FileNotFoundError:
            raise ControlPlaneError(f"no control plane state in {directory} ({path})") from None
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ControlPlaneError(f"unreadable state file {path}: {err}") from None
        plane = cls(directory, binaries={})
        plane.ports = ports
        plane._started = [(proc, None) for proc in procs]
        return plane

    def alive(self) -> list[Proc]:
        """The started processes that are still running."""
        return [proc for proc in self.processes if processes.alive(proc)]

    # -- optional components ----------------------------------------------------------

    def component_kubeconfig(self, name: str, user: str, groups: tuple[str, ...] = ()) -> Path:
        """A client certificate for user in groups, and a kubeconfig for it, under DIR."""
        pair = self.pki.issue_client(name, user, groups)
        text = kubeconfig.render(self.url, self.ca_path, user, kubeconfig.client_credentials(pair))
        return kubeconfig.write_private(self.directory / f"{name}.kubeconfig", text)

    def _healthz(self, base: str) -> bool:
        try:
            return self.request_text("GET", "/healthz", base=base, timeout=2.0) == "ok"
        except (OSError, ApiError):
            return False

    def _start_component(self, name: str, argv: list[str], health: str, timeout: float) -> Proc:
        proc, popen = self._spawn(name, argv)
        self._wait(proc, popen, lambda: self._healthz(health), "/healthz answering ok", timeout)
        self.save_state()
        return proc

    def start_controller_manager(
        self,
        *,
        controllers: str = "*",
        cluster_cidr: str | None = CLUSTER_CIDR,
        node_cidr_mask_size: int = 24,
        extra_args: Sequence[str] = (),
        timeout: float = COMPONENT_START_S,
    ) -> Proc:
        """Start kube-controller-manager (the DaemonSet, namespace, garbage-collector,
        ... controllers); with cluster_cidr it also gives each Node a podCIDR."""
        port = free_port()
        config = self.component_kubeconfig(
            "kube-controller-manager", "system:kube-controller-manager"
        )
        argv = flags.controller_manager_argv(
            self.binary("kube-controller-manager"),
            self.pki,
            config,
            port,
            controllers=controllers,
            cluster_cidr=cluster_cidr,
            node_cidr_mask_size=node_cidr_mask_size,
            extra=extra_args,
        )
        return self._start_component(
            "kube-controller-manager", argv, f"https://{LOOPBACK}:{port}", timeout
        )

    def start_scheduler(
        self, *, extra_args: Sequence[str] = (), timeout: float = COMPONENT_START_S
    ) -> Proc:
        """Start kube-scheduler (binds pods to nodes, KWOK's fake ones included)."""
        port = free_port()
        config = self.component_kubeconfig("kube-scheduler", "system:kube-scheduler")
        argv = flags.scheduler_argv(
            self.binary("kube-scheduler"), self.pki, config, port, extra_args
        )
        return self._start_component("kube-scheduler", argv, f"https://{LOOPBACK}:{port}", timeout)

    def start_kwok(
        self,
        *,
        node_annotation_selector: str = KWOK_NODE_SELECTOR,
        node_ip: str = LOOPBACK,
        cidr: str = KWOK_DEFAULT_CIDR,
        extra_args: Sequence[str] = (),
        timeout: float = COMPONENT_START_S,
    ) -> Proc:
        """Start KWOK: Nodes annotated with node_annotation_selector become Ready and
        keep a Lease; their pods go Running with IPs from the node's podCIDR (else cidr).

        node_ip is the address KWOK reports for its nodes (and pods' hostIP):
        loopback, so that anything that does try to reach a "kubelet" stays on
        this machine. KWOK acts as system:masters: it stands in for every kubelet.
        """
        port = free_port()
        config = self.component_kubeconfig("kwok", "kwok", ("system:masters",))
        argv = flags.kwok_argv(
            self.binary("kwok"),
            config,
            self.binary("kwok-stages"),
            port,
            node_selector=node_annotation_selector,
            node_ip=node_ip,
            cidr=cidr,
            extra=extra_args,
        )
        proc, popen = self._spawn("kwok", argv)
        self._wait(proc, popen, lambda: self._kwok_healthy(port), "/healthz answering ok", timeout)
        self.save_state()
        return proc

    @staticmethod
    def _kwok_healthy(port: int) -> bool:
        url = f"http://{LOOPBACK}:{port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.read() == b"ok")
        except OSError:
            return False
