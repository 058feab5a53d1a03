"""The real control plane: the pinned release, TLS and RBAC on, TokenRequest, a stop
that leaves nothing running, the CLI's errors, and the optional components."""

from __future__ import annotations

import base64
import ipaddress
import json
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.realkube import processes
from tests.realkube.access import ApiError, BoundPod
from tests.realkube.controlplane import ControlPlane, build_kube
from tests.realkube.flags import KWOK_NODE_SELECTOR
from tests.realkube.ports import Ports, port_free

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "scripts" / "realkube.py"


def pinned_kubernetes() -> str:
    """The k8s.io/kubernetes version tools/kube/go.mod pins (v1.37.2)."""
    module = build_kube()
    tool = next(t for t in module.TOOLS_BUILT if t.name == "kube-apiserver")
    version: str = module.pinned_module(tool).version
    return version


def claims(token: str) -> dict[str, Any]:
    """The JWT's payload (unverified: the API server is what verifies it)."""
    payload = token.split(".")[1]
    decoded: dict[str, Any] = json.loads(
        base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    )
    return decoded


def wait_for(check: Any, timeout: float, what: str) -> Any:
    """Poll check() until it returns something truthy; fail naming what after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)


def bind_pod_reader(plane: ControlPlane, namespace: str, service_account: str) -> None:
    """A Role that may read pods, bound to the ServiceAccount. Not the `view` ClusterRole:
    that one is aggregated, and its rules are filled in by kube-controller-manager's
    clusterrole-aggregation controller, which the shared control plane does not run."""
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "pod-reader"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
    }
    plane.request("POST", f"{rbac}/roles", role)
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": f"{service_account}-pod-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
    }
    plane.request("POST", f"{rbac}/rolebindings", binding)


def create_pod(
    plane: ControlPlane, namespace: str, name: str, service_account: str
) -> dict[str, Any]:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "serviceAccountName": service_account,
            "containers": [{"name": "c", "image": "registry.invalid/none:1"}],
        },
    }
    pod: dict[str, Any] = plane.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
    return pod


def whoami(plane: ControlPlane, token: str) -> str:
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    answer = plane.request(
        "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", review, token=token
    )
    return str(answer["status"]["userInfo"]["username"])


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CLI), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=ROOT,
    )


def gone(proc: processes.Proc) -> bool:
    return processes.start_ticks(proc.pid) is None and processes.group_empty(proc.pid)


# -- the shared control plane ---------------------------------------------------------


def test_apiserver_reports_the_pinned_release(
    realkube: ControlPlane, realkube_binaries: dict[str, Path]
) -> None:
    """GET /version and `kube-apiserver --version` both name the release pinned in
    tools/kube/go.mod (not v0.0.0-master): build_kube's version ldflags took."""
    pinned = pinned_kubernetes()
    version = realkube.version()
    assert version["gitVersion"] == pinned
    assert (version["major"], version["minor"]) == tuple(pinned.lstrip("v").split(".")[:2])
    printed = subprocess.run(
        [str(realkube_binaries["kube-apiserver"]), "--version"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert printed.stdout.strip() == f"Kubernetes {pinned}"


def test_readyz_is_ok_with_rbac_bootstrapped(realkube: ControlPlane) -> None:
    """/readyz answers ok, and its verbose form shows the RBAC bootstrap hook done: the
    default ClusterRoles (view, edit, ...) exist as soon as start() returns."""
    assert realkube.request_text("GET", "/readyz") == "ok"
    verbose = realkube.request_text("GET", "/readyz?verbose")
    assert "[+]poststarthook/rbac/bootstrap-roles ok" in verbose
    assert realkube.request("GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles/view")


def test_serves_loopback_only_with_verified_tls(realkube: ControlPlane) -> None:
    """The API server's URL is https on 127.0.0.1 and its certificate verifies against
    ca_path; the kubeconfig carries that CA and the admin client certificate."""
    assert realkube.url.startswith("https://127.0.0.1:")
    text = realkube.kubeconfig.read_text()
    assert realkube.url in text
    assert "certificate-authority-data" in text
    assert "client-certificate-data" in text
    assert realkube.kubeconfig.stat().st_mode & 0o077 == 0


def test_unbound_service_account_is_forbidden(
    realkube: ControlPlane, realkube_namespace: str
) -> None:
    """RBAC is enforced: a ServiceAccount token with no bindings authenticates (403, not
    401) but may not list pods; bound to a Role that allows it, it may."""
    realkube.create_service_account(realkube_namespace, "nobody")
    token = realkube.token(realkube_namespace, "nobody")
    pods = f"/api/v1/namespaces/{realkube_namespace}/pods"
    with pytest.raises(ApiError) as denied:
        realkube.request("GET", pods, token=token)
    assert denied.value.status == 403
    bind_pod_reader(realkube, realkube_namespace, "nobody")
    # RBAC's authorizer reads an informer cache: the binding takes effect promptly, not at once.
    wait_for(lambda: _allowed(realkube, pods, token), 10, "the RoleBinding to take effect")


def _allowed(plane: ControlPlane, path: str, token: str) -> bool:
    try:
        plane.request("GET", path, token=token)
    except ApiError as err:
        if err.status != 403:
            raise
        return False
    return True


def test_token_request_mints_tokens_for_the_service_account(
    realkube: ControlPlane, realkube_namespace: str
) -> None:
    """TokenRequest works: the token names our issuer and the ServiceAccount, has the
    requested lifetime and audience, and authenticates as the ServiceAccount."""
    realkube.create_service_account(realkube_namespace, "agent")
    token = realkube.token(realkube_namespace, "agent", expiration_seconds=900)
    payload = claims(token)
    assert payload["iss"] == realkube.url
    assert payload["sub"] == f"system:serviceaccount:{realkube_namespace}:agent"
    assert payload["exp"] - payload["iat"] == 900
    assert whoami(realkube, token) == f"system:serviceaccount:{realkube_namespace}:agent"
    other = realkube.token(realkube_namespace, "agent", audiences=["capwatch"])
    assert claims(other)["aud"] == ["capwatch"]
    with pytest.raises(ApiError) as rejected:  # not an audience the API server accepts
        whoami(realkube, other)
    assert rejected.value.status == 401


def test_pod_bound_token_dies_with_its_pod(realkube: ControlPlane, realkube_namespace: str) -> None:
    """A pod-bound token carries the pod's name and uid, and the API server rejects it
    (401) once that pod is deleted."""
    realkube.create_service_account(realkube_namespace, "agent")
    pod = create_pod(realkube, realkube_namespace, "agent-0", "agent")
    bound = BoundPod(name="agent-0", uid=pod["metadata"]["uid"])
    token = realkube.token(realkube_namespace, "agent", pod=bound)
    pod_claims = claims(token)["kubernetes.io"]["pod"]
    assert pod_claims == {"name": "agent-0", "uid": bound.uid}
    assert whoami(realkube, token).endswith(":agent")
    # Never scheduled, so no kubelet holds it up: the delete is immediate.
    realkube.request("DELETE", f"/api/v1/namespaces/{realkube_namespace}/pods/agent-0")

    def rejected() -> bool:
        try:
            whoami(realkube, token)
        except ApiError as err:
            return err.status == 401
        return False

    # The API server caches a token's successful authentication for 10 seconds
    # (TokenSuccessCacheTTL), so the rejection comes up to 10 s after the delete.
    wait_for(rejected, 30, "the bound token to be rejected after its pod's deletion")


def test_token_configuration_and_kubeconfig_drive_the_kubernetes_client(
    realkube: ControlPlane, realkube_namespace: str, tmp_path: Path
) -> None:
    """token_configuration() and token_kubeconfig() both give the kubernetes client the
    ServiceAccount's identity over verified TLS."""
    from kubernetes import client, config

    realkube.create_service_account(realkube_namespace, "reader")
    bind_pod_reader(realkube, realkube_namespace, "reader")
    token = realkube.token(realkube_namespace, "reader")
    pods = f"/api/v1/namespaces/{realkube_namespace}/pods"
    wait_for(lambda: _allowed(realkube, pods, token), 10, "the RoleBinding to take effect")
    with client.ApiClient(realkube.token_configuration(token)) as api:
        listed = client.CoreV1Api(api).list_namespaced_pod(realkube_namespace)
        assert listed.items == []
    path = realkube.token_kubeconfig(token, tmp_path / "token.kubeconfig")
    loaded = client.Configuration()
    load_kube_config: Any = config.load_kube_config  # untyped in the kubernetes package
    load_kube_config(config_file=str(path), client_configuration=loaded)
    with client.ApiClient(loaded) as api:
        assert client.CoreV1Api(api).list_namespaced_pod(realkube_namespace).items == []
    with client.ApiClient(realkube.admin_configuration()) as api:
        names = [
            ns.metadata.name for ns in client.CoreV1Api(api).list_namespace().items if ns.metadata
        ]
        assert realkube_namespace in names


# -- control planes of their own --------------------------------------------------------


def test_stop_leaves_no_process(realkube_binaries: dict[str, Path], tmp_path: Path) -> None:
    """stop() ends and reaps etcd and kube-apiserver: neither pid is alive, nothing is
    left in their process groups, their ports are free again, and state.json is gone."""
    plane = ControlPlane(tmp_path / "kube", binaries=realkube_binaries).start()
    started = plane.processes
    ports = plane.ports
    assert [proc.name for proc in started] == ["etcd", "kube-apiserver"]
    assert all(processes.alive(proc) for proc in started)
    assert (plane.directory / "state.json").is_file()
    plane.stop()
    assert all(gone(proc) for proc in started)
    assert ports is not None
    assert port_free(ports.apiserver)
    assert port_free(ports.etcd_client)
    assert not (plane.directory / "state.json").exists()


def test_processes_die_with_the_python_that_started_them(
    realkube_binaries: dict[str, Path], tmp_path: Path
) -> None:
    """A Python process SIGKILLed with a control plane running takes etcd and
    kube-apiserver with it (PR_SET_PDEATHSIG): a crashed test run leaks nothing."""
    binaries = {name: str(path) for name, path in realkube_binaries.items()}
    child = textwrap.dedent(
        f"""
        import json, sys, time
        from pathlib import Path
        from tests.realkube.controlplane import ControlPlane
        binaries = {{k: Path(v) for k, v in json.loads({json.dumps(json.dumps(binaries))}).items()}}
        plane = ControlPlane(Path({str(tmp_path / "kube")!r}), binaries=binaries).start()
        print(json.dumps([p.to_json() for p in plane.processes]), flush=True)
        time.sleep(120)
        """
    )
    starter = subprocess.Popen(
        [sys.executable, "-c", child], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert starter.stdout is not None
        started = [processes.Proc.from_json(p) for p in json.loads(starter.stdout.readline())]
        assert len(started) == 2
        assert all(processes.alive(proc) for proc in started)
    finally:
        starter.send_signal(signal.SIGKILL)
        starter.wait(timeout=10)
        assert starter.stdout is not None
        starter.stdout.close()
    wait_for(lambda: all(gone(proc) for proc in started), 10, "the orphans to die")


def test_cli_up_then_down_leaves_no_process(
    realkube_binaries: dict[str, Path], tmp_path: Path
) -> None:
    """`realkube.py up` returns with the control plane running detached and a working
    DIR/kubeconfig; `realkube.py down` stops it and no process of it is left."""
    directory = tmp_path / "kube"
    started = run_cli("up", "--dir", str(directory))
    assert started.returncode == 0, started.stderr
    assert started.stdout.strip().splitlines()[-1] == str(directory / "kubeconfig")
    plane = ControlPlane.attach(directory)
    procs = plane.processes
    try:
        assert [proc.name for proc in procs] == ["etcd", "kube-apiserver"]
        assert plane.ready()
        again = run_cli("up", "--dir", str(directory))
        assert again.returncode == 1
        assert "already running" in again.stderr
        stopped = run_cli("down", "--dir", str(directory))
        assert stopped.returncode == 0, stopped.stderr
        assert all(gone(proc) for proc in procs)
    finally:
        plane.stop()


def test_cli_rejects_a_dir_that_cannot_be_written(tmp_path: Path) -> None:
    """`up` with a DIR that cannot be a writable directory (here: under a regular file)
    fails with exit 1 and exactly one line on stderr, no traceback."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = run_cli("up", "--dir", str(blocker / "kube"))
    assert result.returncode == 1
    assert len(result.stderr.splitlines()) == 1
    assert "not a writable directory" in result.stderr


def test_cli_rejects_a_busy_port(realkube: ControlPlane, tmp_path: Path) -> None:
    """`up --apiserver-port` with a port already taken (the shared API server's) fails
    with exit 1 and one line naming the port, and starts nothing."""
    assert realkube.ports is not None
    busy = realkube.ports.apiserver
    result = run_cli("up", "--dir", str(tmp_path / "kube"), "--apiserver-port", str(busy))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [f"realkube: port {busy} on 127.0.0.1 is already in use"]
    assert not (tmp_path / "kube" / "state.json").exists()


def test_cli_down_without_state_is_one_line(tmp_path: Path) -> None:
    """`down` on a DIR that no `up` used fails with exit 1 and one line on stderr."""
    result = run_cli("down", "--dir", str(tmp_path))
    assert result.returncode == 1
    assert len(result.stderr.splitlines()) == 1
    assert "no control plane state" in result.stderr


def test_explicit_ports_must_be_free() -> None:
    """Ports.free refuses a given port that something already listens on."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(Exception, match=f"port {port} on 127.0.0.1 is already in use"):
            Ports.free(apiserver=port)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_daemonset_pod_runs_on_a_kwok_node(
    realkube_binaries: dict[str, Path], tmp_path: Path
) -> None:
    """With kube-controller-manager, kube-scheduler and KWOK: an annotated fake Node gets
    a podCIDR and goes Ready, and a DaemonSet's pod lands on it and goes Running with
    an IP inside that podCIDR."""
    with ControlPlane(tmp_path / "kube", binaries=realkube_binaries).start() as plane:
        plane.start_controller_manager()
        plane.start_scheduler()
        plane.start_kwok()
        key, value = KWOK_NODE_SELECTOR.split("=")
        node_name = f"fake-{uuid.uuid4().hex[:6]}"
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node_name,
                "annotations": {key: value},
                "labels": {"type": "kwok"},
            },
        }
        plane.request("POST", "/api/v1/nodes", node)

        def ready_node() -> dict[str, Any] | None:
            got: dict[str, Any] = plane.request("GET", f"/api/v1/nodes/{node_name}")
            conditions = {
                c["type"]: c["status"] for c in got.get("status", {}).get("conditions", [])
            }
            return got if conditions.get("Ready") == "True" and got["spec"].get("podCIDR") else None

        ready = wait_for(ready_node, 60, "the fake node to be Ready with a podCIDR")
        daemonset = {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "probe"},
            "spec": {
                "selector": {"matchLabels": {"app": "probe"}},
                "template": {
                    "metadata": {"labels": {"app": "probe"}},
                    "spec": {
                        "nodeSelector": {"type": "kwok"},
                        "containers": [{"name": "c", "image": "registry.invalid/none:1"}],
                    },
                },
            },
        }
        plane.request("POST", "/apis/apps/v1/namespaces/default/daemonsets", daemonset)

        def running_pod() -> dict[str, Any] | None:
            pods = plane.request("GET", "/api/v1/namespaces/default/pods?labelSelector=app%3Dprobe")
            for pod in pods["items"]:
                if pod["status"].get("phase") == "Running" and pod["status"].get("podIP"):
                    found: dict[str, Any] = pod
                    return found
            return None

        pod = wait_for(running_pod, 90, "the DaemonSet's pod to be Running")
        assert pod["spec"]["nodeName"] == node_name
        cidr = ipaddress.ip_network(ready["spec"]["podCIDR"])
        assert ipaddress.ip_address(pod["status"]["podIP"]) in cidr
        assert (plane.logs / "kwok.log").is_file()
