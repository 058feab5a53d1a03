"""The DaemonSet as rendered: probes, ports, security, volumes, rollout, and agent flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from capwatch.agent.settings import BackendKind, agent_settings
from capwatch.cli import _parser  # the real `capwatch` parser: what the image will accept
from capwatch.kit.flags import LogFormat
from capwatch.server.settings import server_settings
from tests.chart.support import VARIANTS, Helm, Manifests, ports

SOCKET = "unix:///run/capwatch/agent.sock"
PROBE_KEYS = ("readinessProbe", "livenessProbe", "startupProbe")


def test_readiness_probe_is_exactly_the_designed_one(default: Manifests) -> None:
    """The shim's probe is httpGet /readyz :8081, delay 15 s, period 10 s, threshold 3, no more."""
    assert default.container("readyz")["readinessProbe"] == {
        "httpGet": {"path": "/readyz", "port": 8081},
        "initialDelaySeconds": 15,
        "periodSeconds": 10,
        "failureThreshold": 3,
    }


def test_probe_port_is_the_shims_named_readyz_port(default: Manifests) -> None:
    """The probed port is the shim's port named readyz (8081), which the shim is told to serve."""
    shim = default.container("readyz")
    assert ports(shim) == {"readyz": 8081}
    assert shim["readinessProbe"]["httpGet"]["port"] == ports(shim)["readyz"]
    assert {"name": "CAPWATCH_READYZ_PORT", "value": "8081"} in shim["env"]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_no_liveness_or_startup_probe_in_the_agent_pod(
    rendered: dict[str, Manifests], variant: str
) -> None:
    """No agent-pod container has a liveness or startup probe; only the shim has a readiness
    probe (the controller's liveness probe is test_controller's)."""
    containers = rendered[variant].pod_spec["containers"]
    assert [c["name"] for c in containers] == ["agent", "readyz"]
    probes = {c["name"]: sorted(k for k in PROBE_KEYS if k in c) for c in containers}
    assert probes == {"agent": [], "readyz": ["readinessProbe"]}


def test_agent_ports_are_named_grpc_and_metrics(default: Manifests) -> None:
    """The agent exposes grpc 50051 and metrics 9400 under those names."""
    assert ports(default.container("agent")) == {"grpc": 50051, "metrics": 9400}


def test_metrics_off_removes_metrics_ports_only(rendered: dict[str, Manifests]) -> None:
    """metrics.port 0 passes --metrics-port=0 and drops the metrics ports from pod and Service."""
    off = rendered["metrics-off"]
    agent = off.container("agent")
    assert ports(agent) == {"grpc": 50051}
    assert "--metrics-port=0" in agent["args"]
    assert [p["name"] for p in off.one("Service")["spec"]["ports"]] == ["grpc"]
    assert (
        off.container("readyz")["readinessProbe"]
        == rendered["default"].container("readyz")["readinessProbe"]
    )


def test_agent_is_privileged_with_host_pid(default: Manifests) -> None:
    """The agent runs privileged as root in the host's PID namespace, reading the host's /proc."""
    agent = default.container("agent")
    assert default.pod_spec["hostPID"] is True
    assert agent["securityContext"]["privileged"] is True
    assert agent["securityContext"]["runAsUser"] == 0
    assert "--proc-root=/proc" in agent["args"]


def test_shim_is_non_root_read_only_and_unprivileged(default: Manifests) -> None:
    """The shim: non-root 65532 in the socket group, read-only root, no escalation, no caps."""
    context = default.container("readyz")["securityContext"]
    assert context == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 2000,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def test_socket_group_reaches_the_agent_and_the_shim(default: Manifests) -> None:
    """The agent gives the socket to group 2000; the pod's fsGroup and the shim's group are 2000."""
    assert "--grpc-socket-group=2000" in default.container("agent")["args"]
    assert default.pod_spec["securityContext"] == {"fsGroup": 2000}
    assert default.container("readyz")["securityContext"]["runAsGroup"] == 2000


def test_socket_directory_is_a_shared_empty_dir(default: Manifests) -> None:
    """/run/capwatch is one emptyDir in both containers; the shim's mount is read-only."""
    assert default.volume("sockets") == {"name": "sockets", "emptyDir": {}}
    mounts = {
        c["name"]: [m for m in c["volumeMounts"] if m["name"] == "sockets"]
        for c in default.pod_spec["containers"]
    }
    assert mounts == {
        "agent": [{"name": "sockets", "mountPath": "/run/capwatch"}],
        "readyz": [{"name": "sockets", "mountPath": "/run/capwatch", "readOnly": True}],
    }
    agent, shim = default.container("agent"), default.container("readyz")
    assert f"--grpc-listen={SOCKET}" in agent["args"]
    assert shim["args"][:3] == ["shim", "--target", SOCKET]
    assert "--log-format=json" in shim["args"]  # one log format across the pod


def test_state_directory_is_a_host_path(default: Manifests) -> None:
    """The ownership record is on hostPath /var/lib/capwatch (DirectoryOrCreate), at --state-dir."""
    assert default.volume("state")["hostPath"] == {
        "path": "/var/lib/capwatch",
        "type": "DirectoryOrCreate",
    }
    agent = default.container("agent")
    assert {"name": "state", "mountPath": "/var/lib/capwatch"} in agent["volumeMounts"]
    assert "--state-dir=/var/lib/capwatch" in agent["args"]


def test_node_name_comes_from_the_downward_api(default: Manifests) -> None:
    """NODE_NAME (the agent's --node-name twin) is the pod's spec.nodeName."""
    env = {e["name"]: e for e in default.container("agent")["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_api_token_is_mounted_into_the_agent_only(default: Manifests) -> None:
    """Automount is off; only the agent mounts the token, where in-cluster config reads it."""
    assert default.pod_spec["automountServiceAccountToken"] is False
    mount_path = "/var/run/secrets/kubernetes.io/serviceaccount"
    mounted = {
        c["name"]: [m["mountPath"] for m in c["volumeMounts"] if m["name"] == "kube-api-access"]
        for c in default.pod_spec["containers"]
    }
    assert mounted == {"agent": [mount_path], "readyz": []}
    sources = default.volume("kube-api-access")["projected"]["sources"]
    assert [next(iter(s)) for s in sources] == ["serviceAccountToken", "configMap", "downwardAPI"]


def test_rolling_update_one_node_at_a_time(rendered: dict[str, Manifests]) -> None:
    """Every variant rolls out with RollingUpdate, maxUnavailable 1 and no surge."""
    for manifests in rendered.values():
        assert manifests.one("DaemonSet")["spec"]["updateStrategy"] == {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0},
        }


@pytest.mark.parametrize("unavailable", ["3", "10%"])
def test_update_strategy_passes_through(helm: Helm, unavailable: str) -> None:
    """agent.updateStrategy reaches the DaemonSet as given: a number or a percent."""
    manifests = helm.render("--set-string" if "%" in unavailable else "--set",
        f"agent.updateStrategy.rollingUpdate.maxUnavailable={unavailable}")  # fmt: skip
    rolling = manifests.one("DaemonSet")["spec"]["updateStrategy"]["rollingUpdate"]
    assert str(rolling["maxUnavailable"]) == unavailable
    on_delete = helm.render("--set-json", 'agent.updateStrategy={"type": "OnDelete"}')
    assert on_delete.one("DaemonSet")["spec"]["updateStrategy"] == {"type": "OnDelete"}


@pytest.mark.parametrize(
    "setting",
    [
        "agent.updateStrategy.rollingUpdate.maxSurge=1",
        "agent.updateStrategy.rollingUpdate.maxUnavailable=0",
        "agent.updateStrategy.rollingUpdate.maxUnavailable=150%",
        "agent.updateStrategy.type=Recreate",
    ],
)
def test_update_strategies_that_break_a_node_are_refused(helm: Helm, setting: str) -> None:
    """A surge (two agents writing one node's GPUs), no progress at all, a percent over
    100 and a strategy DaemonSets do not have are refused at render time."""
    flag = "--set-string" if "%" in setting else "--set"
    done = helm.template(flag, setting)
    assert done.returncode != 0
    assert "updateStrategy" in done.stderr


@pytest.mark.parametrize(
    ("values", "args"),
    [
        ((), ["--mode=enforce", "--unclaimed-policy=safeDefault"]),
        (
            ("--set", "agent.mode=observe", "--set", "agent.unclaimedPolicy=leave"),
            ["--mode=observe", "--unclaimed-policy=leave"],
        ),
    ],
)
def test_mode_and_unclaimed_policy_reach_the_agent(
    helm: Helm, values: tuple[str, ...], args: list[str]
) -> None:
    """agent.mode and agent.unclaimedPolicy become the agent's flags; anything else is
    refused by the schema."""
    container = helm.render(*values).container("agent")
    assert set(args) <= set(container["args"])
    for bad in ("agent.mode=dryrun", "agent.unclaimedPolicy=ignore"):
        assert helm.template("--set", bad).returncode != 0


def test_grace_period_defaults_to_60(default: Manifests) -> None:
    """terminationGracePeriodSeconds is 60 by default."""
    assert default.pod_spec["terminationGracePeriodSeconds"] == 60


def test_gpu_node_scheduling_defaults(default: Manifests) -> None:
    """GPU nodes only, tolerating the nvidia.com/gpu taint, at system-node-critical priority."""
    spec = default.pod_spec
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    assert spec["priorityClassName"] == "system-node-critical"
    assert "affinity" not in spec
    assert "runtimeClassName" not in spec


def test_image_defaults_to_the_chart_app_version(default: Manifests) -> None:
    """Both containers run one image, tagged with the chart's appVersion, as `capwatch`."""
    chart = (Path(__file__).resolve().parents[2] / "charts/capwatch/Chart.yaml").read_text()
    app_version = next(
        line.split(":", 1)[1].strip().strip('"')
        for line in chart.splitlines()
        if line.startswith("appVersion:")
    )
    for container in default.pod_spec["containers"]:
        assert container["image"] == f"capwatch:{app_version}"
        assert container["imagePullPolicy"] == "IfNotPresent"
        assert container["command"] == ["capwatch"]


def test_resources_come_from_values(default: Manifests) -> None:
    """Requests and limits are set for both containers, with no CPU limit on the agent."""
    agent, shim = default.container("agent"), default.container("readyz")
    assert agent["resources"] == {
        "requests": {"cpu": "50m", "memory": "128Mi"},
        "limits": {"memory": "512Mi"},
    }
    assert shim["resources"]["requests"] == {"cpu": "10m", "memory": "48Mi"}


def test_rendered_agent_flags_are_accepted_by_the_real_cli(default: Manifests) -> None:
    """The agent's args and env parse through `capwatch agent` into the intended settings."""
    agent = default.container("agent")
    assert agent["args"][0] == "agent"
    namespace = _parser().parse_args(agent["args"])
    env = {e["name"]: e.get("value", "") for e in agent["env"]}
    env["NODE_NAME"] = "gpu-node-1"  # what the downward API would fill in
    settings = agent_settings(namespace, env)
    serving = server_settings(namespace, env)
    assert settings.node_name == "gpu-node-1"
    assert settings.gpu_backend is BackendKind.NVML
    assert settings.interval_s == 15.0
    assert settings.safe_default_watts == 300
    assert settings.annotation_key == "capwatch.io/gpu-power-limit"
    assert settings.pod_events is True
    assert settings.xid_policy.ignore == frozenset({13, 31, 43, 45, 68, 109})
    assert (settings.xid_policy.fatal, settings.fault_recovery_s) == (frozenset(), 600.0)
    assert settings.log_format is LogFormat.JSON
    assert str(settings.state_dir) == "/var/lib/capwatch"
    assert str(settings.proc_root) == "/proc"
    assert [listener.address for listener in serving.listeners] == [SOCKET, "0.0.0.0:50051"]
    assert serving.socket_group == "2000"
    assert (serving.max_subscribers, serving.reserved_local_subscribers) == (10000, 16)
    assert serving.max_streams_per_peer == 64
    assert serving.metrics_port == 9400
    assert serving.dra_pool_name is None
    assert serving.dra_device_name == "gpu-{index}"
    # The agent must finish and restore caps well inside the grace period.
    assert (
        settings.shutdown_grace_s + serving.grace_s
        < default.pod_spec["terminationGracePeriodSeconds"]
    )


def test_device_health_values_reach_the_agent(helm: Helm) -> None:
    """agent.xidIgnore, xidFatal and faultRecoverySeconds become the agent's flags."""
    manifests = helm.render(
        "--set-string",
        "agent.xidIgnore=all",
        "--set-string",
        "agent.xidFatal=79\\,48",
        "--set",
        "agent.faultRecoverySeconds=120",
    )
    agent = manifests.container("agent")
    settings = agent_settings(_parser().parse_args(agent["args"]), {"NODE_NAME": "n"})
    assert settings.xid_policy.ignore_all is True
    assert settings.xid_policy.fatal == frozenset({79, 48})
    assert settings.fault_recovery_s == 120.0


def test_tls_secrets_reach_the_agent_as_renewable_files(rendered: dict[str, Manifests]) -> None:
    """grpc.tls mounts the Secrets whole (renewals update in place) and passes their files."""
    tls = rendered["tls-netpol"]
    agent = tls.container("agent")
    flags = [a for a in agent["args"] if a.startswith("--grpc-tls-")]
    assert flags == [
        "--grpc-tls-cert=/etc/capwatch/tls/tls.crt",
        "--grpc-tls-key=/etc/capwatch/tls/tls.key",
        "--grpc-tls-client-ca=/etc/capwatch/client-ca/ca.crt",
    ]
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    for name, path in (
        ("grpc-tls", "/etc/capwatch/tls"),
        ("grpc-client-ca", "/etc/capwatch/client-ca"),
    ):
        assert mounts[name] == {"name": name, "mountPath": path, "readOnly": True}  # no subPath
    assert tls.volume("grpc-tls")["secret"] == {
        "secretName": "capwatch-grpc-tls",
        "defaultMode": 0o400,
        "items": [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}],
    }
    assert tls.volume("grpc-client-ca")["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    # The shim talks to the plaintext socket and mounts no certificate.
    assert {m["name"] for m in tls.container("readyz")["volumeMounts"]} == {"sockets"}
    assert _parser().parse_args(agent["args"]).grpc_tls_client_ca == (
        "/etc/capwatch/client-ca/ca.crt"
    )


def test_no_tls_by_default(default: Manifests) -> None:
    """Without grpc.tls the agent gets no TLS flags and no certificate volumes."""
    agent = default.container("agent")
    assert not [a for a in agent["args"] if a.startswith("--grpc-tls-")]
    assert not {"grpc-tls", "grpc-client-ca"} & {v["name"] for v in default.pod_spec["volumes"]}
