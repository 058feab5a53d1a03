"""The cluster controller as rendered (controller.enabled): the StatefulSet and its flags as
the real ``capwatch controller`` reads them, the Service, the RBAC rule by rule, the cleanup
hook, and the values the chart refuses."""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from agent.errors import ConfigError
from capwatch.cli import _parser  # the real `capwatch` parser: what the image will accept
from controller.kube import EVENT_NAMESPACE
from controller.leasing import LeaseConfig
from controller.serving import ClusterServer
from controller.settings import ControllerSettings, controller_settings
from controller.writing import REQUEST_TIMEOUT_S
from server.readyz import PATH as READYZ_PATH
from tests.chart.support import CHART, NAMESPACE, RELEASE, Helm, Manifests, ports

SCHEMA_ERROR = "values don't meet the specifications of the schema"
NAME = f"{RELEASE}-controller"
CLEANUP = f"{RELEASE}-controller-cleanup"
AGENT_SELECTOR = (
    "app.kubernetes.io/name=capwatch,app.kubernetes.io/component=node-agent,"
    f"app.kubernetes.io/instance={RELEASE}"
)
CLUSTER_RULES = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]
NAMESPACE_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["get", "create", "update"],
    },
]
CLEANUP_RULES = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]},
    {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
]
RESTRICTED = {
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "runAsGroup": 65532,
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


@pytest.fixture(scope="module")
def enabled(helm: Helm) -> Manifests:
    """The chart with the controller on and every other value at its default."""
    return helm.render("--set", "controller.enabled=true")


@pytest.fixture(scope="module")
def tls(rendered: dict[str, Manifests]) -> Manifests:
    """The ci/ variant: two shards of two replicas, agents on mutual TLS, monitoring on."""
    return rendered["controller-tls"]


def _named(manifests: Manifests, kind: str, name: str) -> dict[str, Any]:
    found = [o for o in manifests.of_kind(kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def _statefulset(manifests: Manifests) -> dict[str, Any]:
    return manifests.one("StatefulSet")


def _pod_spec(manifests: Manifests) -> dict[str, Any]:
    spec: dict[str, Any] = _statefulset(manifests)["spec"]["template"]["spec"]
    return spec


def _container(manifests: Manifests) -> dict[str, Any]:
    (container,) = _pod_spec(manifests)["containers"]
    assert container["name"] == "controller"
    return container


def _pod_labels(manifests: Manifests, kind: str) -> dict[str, str]:
    labels: dict[str, str] = manifests.one(kind)["spec"]["template"]["metadata"]["labels"]
    return labels


def _matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return selector.items() <= labels.items()


def _selector_terms(text: str) -> dict[str, str]:
    terms = dict(term.split("=", 1) for term in text.split(","))
    assert len(terms) == len(text.split(",")), f"a key repeats in {text}"
    return terms


def _flag(container: Mapping[str, Any], flag: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in container["args"] if a.startswith(f"{flag}=")]
    return value


def _env(container: Mapping[str, Any], pod_name: str) -> dict[str, str]:
    """The container's environment as the kubelet fills it in for pod ``pod_name``."""
    fields = {"metadata.name": pod_name, "metadata.namespace": NAMESPACE}
    env = {}
    for var in container.get("env", []):
        if "valueFrom" in var:
            env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[var["name"]] = var.get("value", "")
    return env


def _settings(
    container: Mapping[str, Any], pod_name: str, files: Path | None = None
) -> ControllerSettings:
    """The container's args and env through the real parser and settings; TLS files, which
    exist only in the pod, are made under ``files`` with the same names."""
    args = list(container["args"])
    if files is not None:
        for i, arg in enumerate(args):
            if arg.startswith("--agent-tls-") and "=/etc/capwatch/" in arg:
                flag, path = arg.split("=", 1)
                local = files / path.removeprefix("/etc/capwatch/")
                local.parent.mkdir(parents=True, exist_ok=True)
                local.write_text("PEM\n")
                args[i] = f"{flag}={local}"
    namespace = _parser().parse_args(args)
    assert namespace.command == "controller"
    return controller_settings(namespace, _env(container, pod_name))


def _controller_env_twins(capsys: pytest.CaptureFixture[str]) -> set[str]:
    """Every environment twin `capwatch controller --help` declares."""
    with pytest.raises(SystemExit):
        _parser().parse_args(["controller", "--help"])
    return set(re.findall(r"\[env\s+([A-Z0-9_]+);", capsys.readouterr().out))


# --- off by default ----------------------------------------------------------------------


def test_controller_is_off_by_default(rendered: dict[str, Manifests]) -> None:
    """Without controller.enabled no variant but the controller's renders a controller
    object, so existing installs get no StatefulSet, Job, Role or second Service."""
    for variant, manifests in rendered.items():
        has = [o["kind"] for o in manifests if "controller" in o["metadata"]["name"]]
        assert bool(has) == (variant == "controller-tls"), (variant, has)


def test_controller_objects(enabled: Manifests, rendered: dict[str, Manifests]) -> None:
    """controller.enabled adds exactly: its StatefulSet, Service, ServiceAccount, ClusterRole
    and Role with bindings, and the cleanup hook (its own account, role, binding and Job)."""
    agent_kinds = rendered["default"].kinds()
    added = sorted(enabled.kinds())
    for kind in agent_kinds:
        added.remove(kind)
    controller = ["StatefulSet", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"]
    hook = ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job"]
    assert added == sorted([*controller, "Role", "RoleBinding", *hook])
    for kind in ("StatefulSet", "Service", "ServiceAccount", "ClusterRole", "Role"):
        labels = _named(enabled, kind, NAME)["metadata"]["labels"]
        assert labels["app.kubernetes.io/component"] == "controller"


# --- the StatefulSet ---------------------------------------------------------------------


def test_replicas_are_shards_times_replicas_per_shard(
    enabled: Manifests, tls: Manifests, helm: Helm
) -> None:
    """replicas = controller.shards x controller.replicasPerShard, and --shards is passed."""
    assert _statefulset(enabled)["spec"]["replicas"] == 2  # 1 shard x 2
    assert _flag(_container(enabled), "--shards") == "1"
    assert _statefulset(tls)["spec"]["replicas"] == 4  # 2 x 2
    assert _flag(_container(tls), "--shards") == "2"
    three = helm.render(
        "--set", "controller.enabled=true",
        "--set", "controller.shards=3",
        "--set", "controller.replicasPerShard=1",
    )  # fmt: skip
    assert _statefulset(three)["spec"]["replicas"] == 3
    assert _flag(_container(three), "--shards") == "3"


def test_every_ordinal_gets_its_shard_and_lease_from_pod_name(
    tls: Manifests, tmp_path: Path
) -> None:
    """Through the real settings, pod <statefulset>-<ordinal> serves shard ordinal mod shards
    (from POD_NAME), so each of the 2 shards gets 2 replicas, contending for its own Lease."""
    statefulset = _statefulset(tls)
    name, replicas = statefulset["metadata"]["name"], statefulset["spec"]["replicas"]
    by_shard: dict[int, list[str]] = {}
    for ordinal in range(replicas):
        pod = f"{name}-{ordinal}"
        settings = _settings(_container(tls), pod, tmp_path)
        assert settings.shards == 2
        assert settings.shard_index == ordinal % 2
        assert settings.lease_name == f"capwatch-controller-{ordinal % 2}"
        assert settings.identity.startswith(f"{pod}_")
        by_shard.setdefault(settings.shard_index, []).append(pod)
    assert by_shard == {0: [f"{NAME}-0", f"{NAME}-2"], 1: [f"{NAME}-1", f"{NAME}-3"]}


def test_rendered_controller_flags_are_accepted_by_the_real_cli(enabled: Manifests) -> None:
    """The controller's args and env parse through `capwatch controller` into the intended
    settings: the release namespace, this release's agents at their gRPC port, the GPU node
    selector, the lease timings, the ports, plaintext to the agents."""
    container = _container(enabled)
    assert container["command"] == ["capwatch"]
    assert container["args"][0] == "controller"
    settings = _settings(container, f"{NAME}-1")
    assert settings.namespace == NAMESPACE
    assert settings.targets is None  # discovery by watching the agent pods
    assert settings.agent_selector == AGENT_SELECTOR
    assert settings.agent_port == 50051
    assert settings.gpu_node_selector == "nvidia.com/gpu.present=true"
    assert (settings.shards, settings.shard_index) == (1, 0)
    assert settings.lease == LeaseConfig(lease_s=15.0, renew_deadline_s=10.0, retry_s=2.0)
    assert settings.condition_heartbeat_s == 300.0
    assert settings.grpc_listen == "0.0.0.0:50052"
    assert (settings.metrics_port, settings.probe_port) == (9401, 8082)
    assert settings.dry_run is False
    assert settings.kubeconfig is None  # in-cluster configuration
    assert settings.agent_tls is None
    assert (settings.log_level, settings.log_format.value) == ("INFO", "json")


def test_environment_is_the_downward_api_and_real_twins(
    enabled: Manifests, helm: Helm, capsys: pytest.CaptureFixture[str]
) -> None:
    """POD_NAME and POD_NAMESPACE come from the Downward API, and every variable the chart
    sets (extraEnv aside) is an environment twin `capwatch controller` declares."""
    env = {e["name"]: e for e in _container(enabled)["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    twins = _controller_env_twins(capsys)
    assert {"POD_NAME", "POD_NAMESPACE", "CAPWATCH_CONTROLLER_SHARDS"} <= twins
    assert set(env) <= twins
    extra = helm.render(
        "--set", "controller.enabled=true",
        "--set", "controller.extraEnv[0].name=CAPWATCH_CONTROLLER_IDENTITY",
        "--set", "controller.extraEnv[0].value=me",
        "--set", "controller.extraArgs={--log-level=debug}",
    )  # fmt: skip
    container = _container(extra)
    assert container["args"][-1] == "--log-level=debug"
    settings = _settings(container, f"{NAME}-0")
    assert (settings.identity, settings.log_level) == ("me", "DEBUG")


def test_agent_selector_is_exactly_this_releases_agent_pods(enabled: Manifests, helm: Helm) -> None:
    """--agent-selector names the agent pods' name, component and instance labels, all of
    which the DaemonSet's pods carry; it matches neither the controller's nor the cleanup
    Job's pods, nor another release's agents."""
    selector = _selector_terms(_flag(_container(enabled), "--agent-selector"))
    assert set(selector) == {
        "app.kubernetes.io/name",
        "app.kubernetes.io/component",
        "app.kubernetes.io/instance",
    }
    assert _matches(selector, _pod_labels(enabled, "DaemonSet"))
    assert not _matches(selector, _pod_labels(enabled, "StatefulSet"))
    assert not _matches(selector, _pod_labels(enabled, "Job"))
    other = helm.run(
        "template", "other", str(CHART), "--namespace", NAMESPACE,
        "--set", "controller.enabled=true",
    )  # fmt: skip
    assert other.returncode == 0, other.stderr
    others = Manifests.parse(other.stdout)
    assert not _matches(selector, _pod_labels(others, "DaemonSet"))
    assert _matches(
        _selector_terms(_flag(_container(others), "--agent-selector")),
        _pod_labels(others, "DaemonSet"),
    )


def test_no_agent_selector_takes_the_controllers_pods(tls: Manifests) -> None:
    """The DaemonSet's selector (immutable once installed), the agents' Service, NetworkPolicy
    and ServiceMonitor match no controller or cleanup pod or Service, and the controller's
    selectors match no agent pod."""
    controller_pods = [_pod_labels(tls, "StatefulSet"), _pod_labels(tls, "Job")]
    agent_pods = _pod_labels(tls, "DaemonSet")
    agent_selectors = [
        tls.one("DaemonSet")["spec"]["selector"]["matchLabels"],
        _named(tls, "Service", RELEASE)["spec"]["selector"],
        tls.one("NetworkPolicy")["spec"]["podSelector"]["matchLabels"],
    ]
    for selector in agent_selectors:
        assert _matches(selector, agent_pods)
        assert not any(_matches(selector, pod) for pod in controller_pods)
    controller_selectors = [
        _statefulset(tls)["spec"]["selector"]["matchLabels"],
        _named(tls, "Service", NAME)["spec"]["selector"],
    ]
    for selector in controller_selectors:
        assert _matches(selector, controller_pods[0])
        assert not _matches(selector, agent_pods)
        assert not _matches(selector, controller_pods[1])  # the cleanup Job's pod
    agent_monitor = _named(tls, "ServiceMonitor", RELEASE)["spec"]["selector"]["matchLabels"]
    assert not _matches(agent_monitor, _named(tls, "Service", NAME)["metadata"]["labels"])


def test_replicas_spread_over_nodes_by_preferred_anti_affinity(
    enabled: Manifests, helm: Helm
) -> None:
    """By default a preferred pod anti-affinity by hostname over the controller's own pods;
    controller.affinity replaces it."""
    affinity = _pod_spec(enabled)["affinity"]
    assert affinity == {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {
                            "matchLabels": _statefulset(enabled)["spec"]["selector"]["matchLabels"]
                        },
                    },
                }
            ]
        }
    }
    custom = helm.render(
        "--set", "controller.enabled=true",
        "--set", "controller.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].key=pool",
        "--set", "controller.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
    )  # fmt: skip
    assert list(_pod_spec(custom)["affinity"]) == ["nodeAffinity"]


def test_statefulset_rolls_one_pod_at_a_time_and_starts_in_parallel(enabled: Manifests) -> None:
    """RollingUpdate (one pod at a time), Parallel pod management, governed by its Service."""
    spec = _statefulset(enabled)["spec"]
    assert spec["updateStrategy"] == {"type": "RollingUpdate"}
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["serviceName"] == _named(enabled, "Service", NAME)["metadata"]["name"]
    assert _matches(spec["selector"]["matchLabels"], spec["template"]["metadata"]["labels"])


def test_ports_and_probes(enabled: Manifests) -> None:
    """grpc 50052, metrics 9401, probes 8082 (what --probe-port serves): readiness on
    /readyz, liveness on /healthz, with the timings pinned."""
    container = _container(enabled)
    assert ports(container) == {"grpc": 50052, "metrics": 9401, "probes": 8082}
    assert _flag(container, "--probe-port") == "8082"
    assert container["readinessProbe"] == {
        "httpGet": {"path": READYZ_PATH, "port": "probes"},
        "initialDelaySeconds": 5,
        "periodSeconds": 10,
        "timeoutSeconds": 5,
        "failureThreshold": 3,
    }
    assert container["livenessProbe"] == {
        "httpGet": {"path": "/healthz", "port": "probes"},
        "initialDelaySeconds": 15,
        "periodSeconds": 10,
        "timeoutSeconds": 5,
        "failureThreshold": 6,
    }
    assert "startupProbe" not in container


def test_controller_runs_restricted(enabled: Manifests) -> None:
    """Non-root, read-only root filesystem, no escalation, no capabilities, RuntimeDefault
    seccomp; the token mounted for its one container, no service links in its environment."""
    spec = _pod_spec(enabled)
    assert _container(enabled)["securityContext"] == RESTRICTED
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "fsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert spec["automountServiceAccountToken"] is True
    assert spec["enableServiceLinks"] is False
    assert "hostPID" not in spec
    assert spec["serviceAccountName"] == NAME
    assert _named(enabled, "ServiceAccount", NAME)["automountServiceAccountToken"] is False
    assert _container(enabled)["resources"] == {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"memory": "1Gi"},
    }
    assert _container(enabled)["image"] == enabled.container("agent")["image"]


def test_grace_period_covers_the_clean_stop(enabled: Manifests, helm: Helm) -> None:
    """30 s by default; the chart refuses a grace period that does not exceed the clean stop
    (the stream's stop grace, the writes in flight, one Lease release attempt) and accepts
    one second more."""
    assert _pod_spec(enabled)["terminationGracePeriodSeconds"] == 30
    lease = LeaseConfig()
    server_grace = inspect.signature(ClusterServer.stop).parameters["grace_s"].default
    stop = server_grace + min(lease.renew_deadline_s, REQUEST_TIMEOUT_S) + lease.attempt_timeout_s
    assert stop == 17.0
    refused = helm.template(
        "--set", "controller.enabled=true",
        "--set", f"controller.terminationGracePeriodSeconds={int(stop)}",
    )  # fmt: skip
    assert refused.returncode != 0
    assert SCHEMA_ERROR not in refused.stderr
    assert "controller.terminationGracePeriodSeconds (17) must exceed 17 s" in refused.stderr
    accepted = helm.render(
        "--set", "controller.enabled=true",
        "--set", f"controller.terminationGracePeriodSeconds={int(stop) + 1}",
    )  # fmt: skip
    assert _pod_spec(accepted)["terminationGracePeriodSeconds"] == 18


def test_values_reach_the_controller(helm: Helm) -> None:
    """Selector, lease timings, heartbeat, logging, ports, scheduling and labels reach the
    flags, ports and pod spec, and the real settings accept the result."""
    manifests = helm.render(
        "--set", "controller.enabled=true",
        "--set", "controller.gpuNodeSelector=gpu=yes\\,pool!=cpu",
        "--set", "controller.leaseDurationSeconds=30",
        "--set", "controller.renewDeadlineSeconds=20",
        "--set-json", "controller.retryPeriodSeconds=2.5",
        "--set", "controller.conditionHeartbeatSeconds=60",
        "--set", "controller.logLevel=debug",
        "--set", "controller.logFormat=text",
        "--set", "controller.grpcPort=50060",
        "--set", "controller.metricsPort=9500",
        "--set", "controller.terminationGracePeriodSeconds=45",
        "--set", "controller.priorityClassName=infra",
        "--set", "controller.nodeSelector.pool=infra",
        "--set", "controller.tolerations[0].key=infra",
        "--set", "controller.tolerations[0].operator=Exists",
        "--set", "controller.podLabels.team=gpu",
        "--set", "controller.podAnnotations.note=x",
        "--set", "grpc.port=50100",
    )  # fmt: skip
    container = _container(manifests)
    settings = _settings(container, f"{NAME}-0")
    assert settings.gpu_node_selector == "gpu=yes,pool!=cpu"
    assert settings.lease == LeaseConfig(lease_s=30.0, renew_deadline_s=20.0, retry_s=2.5)
    assert settings.condition_heartbeat_s == 60.0
    assert (settings.log_level, settings.log_format.value) == ("DEBUG", "text")
    assert settings.grpc_listen == "0.0.0.0:50060"
    assert settings.metrics_port == 9500
    assert settings.agent_port == 50100
    assert ports(container) == {"grpc": 50060, "metrics": 9500, "probes": 8082}
    assert [p["port"] for p in _named(manifests, "Service", NAME)["spec"]["ports"]] == [50060, 9500]
    spec = _pod_spec(manifests)
    assert spec["terminationGracePeriodSeconds"] == 45
    assert spec["priorityClassName"] == "infra"
    assert spec["nodeSelector"] == {"pool": "infra"}
    assert spec["tolerations"] == [{"key": "infra", "operator": "Exists"}]
    template = _statefulset(manifests)["spec"]["template"]["metadata"]
    assert template["labels"]["team"] == "gpu"
    assert template["annotations"] == {"note": "x"}
    # The agents' own scheduling values stay theirs.
    assert manifests.pod_spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}


def test_metrics_off_removes_the_controllers_metrics_ports_only(helm: Helm) -> None:
    """controller.metricsPort 0 passes --metrics-port=0 (no endpoint) and drops the metrics
    ports from the pod and the Service."""
    manifests = helm.render("--set", "controller.enabled=true", "--set", "controller.metricsPort=0")
    container = _container(manifests)
    assert _settings(container, f"{NAME}-0").metrics_port is None
    assert ports(container) == {"grpc": 50052, "probes": 8082}
    assert [p["name"] for p in _named(manifests, "Service", NAME)["spec"]["ports"]] == ["grpc"]


def test_statefulset_name_fits_the_revision_label(helm: Helm) -> None:
    """A long full name is cut so <statefulset>-<10-character hash> stays a valid label value."""
    manifests = helm.render(
        "--set", "controller.enabled=true", "--set", "fullnameOverride=" + "x" * 63
    )
    name = _statefulset(manifests)["metadata"]["name"]
    assert len(name) <= 52
    assert len(f"{name}-{'h' * 10}") <= 63


# --- agent TLS ---------------------------------------------------------------------------


def test_mutual_tls_to_the_agents(tls: Manifests, tmp_path: Path) -> None:
    """With grpc.tls and a client CA: the CA (only that key of the agents' Secret) and the
    client pair are mounted whole, and the real settings get the CA, the pair and the agents'
    Service name as the server name."""
    container = _container(tls)
    flags = [a for a in container["args"] if a.startswith("--agent-tls-")]
    assert flags == [
        "--agent-tls-ca=/etc/capwatch/agent-ca/ca.crt",
        "--agent-tls-cert=/etc/capwatch/agent-client/tls.crt",
        "--agent-tls-key=/etc/capwatch/agent-client/tls.key",
        f"--agent-tls-server-name={RELEASE}.{NAMESPACE}.svc",
    ]
    assert container["volumeMounts"] == [
        {"name": "agent-ca", "mountPath": "/etc/capwatch/agent-ca", "readOnly": True},
        {"name": "agent-client", "mountPath": "/etc/capwatch/agent-client", "readOnly": True},
    ]
    volumes = {v["name"]: v["secret"] for v in _pod_spec(tls)["volumes"]}
    assert volumes == {
        "agent-ca": {
            "secretName": "capwatch-grpc-tls",
            "defaultMode": 0o444,
            "items": [{"key": "ca.crt", "path": "ca.crt"}],
        },
        "agent-client": {
            "secretName": "capwatch-controller-client-tls",
            "defaultMode": 0o440,
            "items": [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}],
        },
    }
    agent_tls = _settings(container, f"{NAME}-0", tmp_path).agent_tls
    assert agent_tls is not None
    assert (agent_tls.ca, agent_tls.cert, agent_tls.key) == (
        tmp_path / "agent-ca/ca.crt",
        tmp_path / "agent-client/tls.crt",
        tmp_path / "agent-client/tls.key",
    )
    # The default server name is the agents' own Service.
    service = _named(tls, "Service", RELEASE)["metadata"]["name"]
    assert agent_tls.server_name == f"{service}.{NAMESPACE}.svc"


def test_server_tls_only_and_overrides(helm: Helm, tmp_path: Path) -> None:
    """Agents on TLS without client certificates: the CA and server name, no client pair;
    the CA Secret, its key and the server name can be named."""
    manifests = helm.render(
        "--set", "controller.enabled=true",
        "--set", "grpc.tls.secretName=agents-tls",
        "--set", "controller.agentTls.caSecretName=agents-ca",
        "--set", "controller.agentTls.caKey=root.pem",
        "--set", "controller.agentTls.serverName=agents.example.com",
    )  # fmt: skip
    container = _container(manifests)
    assert [a for a in container["args"] if a.startswith("--agent-tls-")] == [
        "--agent-tls-ca=/etc/capwatch/agent-ca/ca.crt",
        "--agent-tls-server-name=agents.example.com",
    ]
    (volume,) = _pod_spec(manifests)["volumes"]
    assert volume["secret"]["secretName"] == "agents-ca"
    assert volume["secret"]["items"] == [{"key": "root.pem", "path": "ca.crt"}]
    agent_tls = _settings(container, f"{NAME}-0", tmp_path).agent_tls
    assert agent_tls is not None
    assert (agent_tls.cert, agent_tls.key, agent_tls.server_name) == (
        None,
        None,
        "agents.example.com",
    )


def test_plaintext_agents_mean_no_tls_and_no_volumes(enabled: Manifests) -> None:
    """Without grpc.tls the controller gets no TLS flag, mount or volume."""
    container = _container(enabled)
    assert not [a for a in container["args"] if a.startswith("--agent-tls-")]
    assert "volumeMounts" not in container
    assert "volumes" not in _pod_spec(enabled)


# --- Service, ServiceMonitor, NetworkPolicy ----------------------------------------------


def test_service_serves_the_cluster_stream_and_metrics(enabled: Manifests) -> None:
    """A headless Service over the ready controller pods: grpc 50052 and metrics 9401, by the
    container's port names."""
    spec = _named(enabled, "Service", NAME)["spec"]
    assert spec["clusterIP"] == "None"
    assert "publishNotReadyAddresses" not in spec  # the stream from ready replicas only
    assert _matches(spec["selector"], _pod_labels(enabled, "StatefulSet"))
    assert spec["ports"] == [
        {"name": "grpc", "port": 50052, "targetPort": "grpc", "protocol": "TCP"},
        {"name": "metrics", "port": 9401, "targetPort": "metrics", "protocol": "TCP"},
    ]


def test_service_monitor_for_the_controller(tls: Manifests, enabled: Manifests) -> None:
    """With serviceMonitor.enabled the controller gets its own ServiceMonitor, selecting its
    Service's metrics port and not the agents' Service; none without serviceMonitor."""
    assert len(tls.of_kind("ServiceMonitor")) == 2
    monitor = _named(tls, "ServiceMonitor", NAME)
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert _matches(selector, _named(tls, "Service", NAME)["metadata"]["labels"])
    assert not _matches(selector, _named(tls, "Service", RELEASE)["metadata"]["labels"])
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    [endpoint] = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("30s", "10s")
    assert not enabled.of_kind("ServiceMonitor")


def test_agents_network_policy_lets_this_controller_in(
    tls: Manifests, rendered: dict[str, Manifests]
) -> None:
    """With networkPolicy and the controller on, the agents' policy admits the controller's
    pods (same namespace) to the gRPC port; without the controller there is no such rule."""
    selector = _statefulset(tls)["spec"]["selector"]["matchLabels"]
    controller_rule = {
        "from": [{"podSelector": {"matchLabels": selector}}],
        "ports": [{"port": "grpc", "protocol": "TCP"}],
    }
    readyz_rule = {"ports": [{"port": "readyz", "protocol": "TCP"}]}
    assert tls.one("NetworkPolicy")["spec"]["ingress"] == [readyz_rule, controller_rule]
    agent_only = rendered["tls-netpol"].one("NetworkPolicy")["spec"]["ingress"]
    assert controller_rule not in agent_only
    assert len(agent_only) == 3  # readyz, grpcFrom, metricsFrom


# --- RBAC --------------------------------------------------------------------------------


def test_controller_rbac_is_exactly_what_it_calls(enabled: Manifests) -> None:
    """ClusterRole: nodes list/watch, nodes/status patch, events create. Role in the release
    namespace: pods list/watch, leases get/create/update. Both bound to the controller's own
    account, which is not the agents'."""
    cluster_role = _named(enabled, "ClusterRole", NAME)
    assert cluster_role["rules"] == CLUSTER_RULES
    role = _named(enabled, "Role", NAME)
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == NAMESPACE_RULES
    account = {"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}
    for kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        binding = _named(enabled, kind, NAME)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role_kind,
            "name": NAME,
        }
        assert binding["subjects"] == [account]
    assert _named(enabled, "RoleBinding", NAME)["metadata"]["namespace"] == NAMESPACE
    assert enabled.pod_spec["serviceAccountName"] != NAME
    # Node Events go to another namespace than the release's: hence create in the ClusterRole.
    assert EVENT_NAMESPACE != NAMESPACE


def test_no_role_anywhere_deletes_or_escalates(
    rendered: dict[str, Manifests], enabled: Manifests
) -> None:
    """No rendered role, the controller's and the hook's included, grants delete, a wildcard,
    secrets, or anything on RBAC objects."""
    for manifests in [*rendered.values(), enabled]:
        for role in manifests.of_kind("Role") + manifests.of_kind("ClusterRole"):
            for rule in role["rules"]:
                forbidden = {"delete", "deletecollection", "*", "escalate", "bind", "impersonate"}
                assert not forbidden & set(rule["verbs"])
                assert not {"*", "secrets"} & set(rule["resources"])
                assert "rbac.authorization.k8s.io" not in rule["apiGroups"]


def test_rbac_and_accounts_can_be_left_to_the_operator(helm: Helm) -> None:
    """rbac.create false and a given account: no controller role or binding, no hook account
    or role; the StatefulSet and the cleanup Job run as the account named."""
    manifests = helm.render(
        "--set", "controller.enabled=true",
        "--set", "rbac.create=false",
        "--set", "controller.serviceAccount.create=false",
        "--set", "controller.serviceAccount.name=gpu-controller",
    )  # fmt: skip
    assert not [o for o in manifests if "controller" in o["metadata"]["name"] and o["kind"] in (
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"
    )]  # fmt: skip
    assert _pod_spec(manifests)["serviceAccountName"] == "gpu-controller"
    job = manifests.one("Job")
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "gpu-controller"


# --- the cleanup hook --------------------------------------------------------------------


def _hook(obj: Mapping[str, Any]) -> tuple[str, str, int]:
    annotations = obj["metadata"]["annotations"]
    return (
        annotations["helm.sh/hook"],
        annotations["helm.sh/hook-delete-policy"],
        int(annotations["helm.sh/hook-weight"]),
    )


def test_cleanup_is_a_post_delete_job_with_its_own_account(enabled: Manifests) -> None:
    """`capwatch controller cleanup` runs as a post-delete hook Job (after the controller is
    gone, so no leader writes the condition back), under a hook account and ClusterRole
    created before it (list nodes, patch nodes/status, nothing else), all deleted by Helm
    once it succeeds and before a new one is made."""
    job = _named(enabled, "Job", CLEANUP)
    account = _named(enabled, "ServiceAccount", CLEANUP)
    role = _named(enabled, "ClusterRole", CLEANUP)
    binding = _named(enabled, "ClusterRoleBinding", CLEANUP)
    weights = {}
    for obj in (account, role, binding, job):
        hook, policy, weight = _hook(obj)
        assert hook == "post-delete"
        assert set(policy.split(",")) == {"before-hook-creation", "hook-succeeded"}
        weights[obj["kind"]] = weight
    assert weights["ServiceAccount"] < weights["ClusterRoleBinding"] < weights["Job"]
    assert weights["ClusterRole"] < weights["ClusterRoleBinding"]
    assert role["rules"] == CLEANUP_RULES
    assert binding["roleRef"]["name"] == CLEANUP
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": CLEANUP, "namespace": NAMESPACE}
    ]
    spec = job["spec"]
    assert spec["ttlSecondsAfterFinished"] > 0  # a failed one does not stay for ever
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["serviceAccountName"] == CLEANUP
    assert pod["automountServiceAccountToken"] is True
    (container,) = pod["containers"]
    assert container["image"] == _container(enabled)["image"]
    assert container["securityContext"] == RESTRICTED


def test_cleanup_args_are_accepted_by_the_real_cli(enabled: Manifests) -> None:
    """The Job's args parse as `capwatch controller cleanup` with the release namespace, and
    the real settings accept them without any pod environment."""
    (container,) = _named(enabled, "Job", CLEANUP)["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["capwatch"]
    assert container["args"][:2] == ["controller", "cleanup"]
    namespace = _parser().parse_args(container["args"])
    assert (namespace.command, namespace.action) == ("controller", "cleanup")
    settings = controller_settings(namespace, {})
    assert settings.namespace == NAMESPACE
    assert settings.dry_run is False
    assert "env" not in container


def test_cleanup_can_be_turned_off(helm: Helm) -> None:
    """controller.cleanupOnDelete false renders no hook at all."""
    manifests = helm.render(
        "--set", "controller.enabled=true", "--set", "controller.cleanupOnDelete=false"
    )
    assert not manifests.of_kind("Job")
    assert not [o for o in manifests if "helm.sh/hook" in o["metadata"].get("annotations", {})]
    assert manifests.one("StatefulSet")


# --- values the chart refuses ------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (("--set", "controller.shards=0"), "/controller/shards"),
        (("--set", "controller.shards=1025"), "/controller/shards"),
        (("--set", "controller.replicasPerShard=0"), "/controller/replicasPerShard"),
        (("--set-string", "controller.shards=2"), "/controller/shards"),
        (("--set", "controller.gpuNodeSelector=gpu in (a)"), "/controller/gpuNodeSelector"),
        (("--set", "controller.gpuNodeSelector="), "/controller/gpuNodeSelector"),
        (("--set", "controller.leaseDurationSeconds=0"), "/controller/leaseDurationSeconds"),
        (("--set", "controller.retryPeriodSeconds=-1"), "/controller/retryPeriodSeconds"),
        (("--set", "controller.metricsPort=-1"), "/controller/metricsPort"),
        (("--set", "controller.grpcPort=0"), "/controller/grpcPort"),
        (("--set", "controller.logFormat=xml"), "/controller/logFormat"),
        (("--set", "controller.agentTls.caKey="), "/controller/agentTls/caKey"),
        (("--set", "controller.enabled=yes"), "/controller/enabled"),
        (("--set", "controller.shard=2"), "shard"),
    ],
)
def test_schema_rejects_bad_controller_values(
    helm: Helm, args: tuple[str, ...], where: str
) -> None:
    """The schema rejects wrong types, out-of-range counts and ports, a selector the
    controller would refuse, and unknown keys, naming the key."""
    done = helm.template("--set", "controller.enabled=true", *args)
    assert done.returncode != 0
    assert SCHEMA_ERROR in done.stderr
    assert where in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--set", "controller.renewDeadlineSeconds=15"),
            "controller.leaseDurationSeconds (15) > controller.renewDeadlineSeconds (15) > "
            "controller.retryPeriodSeconds (2) > 0 must hold",
        ),
        (
            ("--set", "controller.retryPeriodSeconds=10"),
            "controller.renewDeadlineSeconds (10) > controller.retryPeriodSeconds (10)",
        ),
        (("--set", "controller.metricsPort=50052"), "must all differ"),
        (("--set", "controller.grpcPort=8082"), "must all differ"),
        (
            ("--set", "serviceMonitor.enabled=true", "--set", "controller.metricsPort=0"),
            "serviceMonitor.enabled with controller.enabled needs the controller's metrics",
        ),
        (
            ("--set", "controller.agentTls.serverName=x"),
            "controller.agentTls needs grpc.tls.secretName",
        ),
        (
            ("--set", "grpc.tls.secretName=tls", "--set", "grpc.tls.clientCA.secretName=ca"),
            "needs controller.agentTls.clientSecretName",
        ),
        (
            ("--set", "rbac.create=false"),
            "controller.cleanupOnDelete with rbac.create false needs "
            "controller.serviceAccount.create false",
        ),
    ],
)
def test_inconsistent_controller_values_fail_rendering(
    helm: Helm, args: tuple[str, ...], message: str
) -> None:
    """Values that pass the schema but contradict each other (or what the controller
    requires) fail with a message naming them."""
    done = helm.template("--set", "controller.enabled=true", *args)
    assert done.returncode != 0
    assert SCHEMA_ERROR not in done.stderr
    assert message in done.stderr


def test_lease_order_is_checked_past_the_schema_and_matches_the_controller(helm: Helm) -> None:
    """The lease rule holds under --skip-schema-validation too, and is the controller's own:
    its LeaseConfig refuses the same timings."""
    done = helm.template(
        "--set", "controller.enabled=true",
        "--set", "controller.leaseDurationSeconds=10",
        "--skip-schema-validation",
    )  # fmt: skip
    assert done.returncode != 0
    assert "controller.leaseDurationSeconds (10) > controller.renewDeadlineSeconds (10)" in (
        done.stderr
    )
    with pytest.raises(ConfigError):
        LeaseConfig(lease_s=10.0, renew_deadline_s=10.0, retry_s=2.0)


def test_controller_checks_apply_only_when_it_is_enabled(helm: Helm) -> None:
    """Controller values that would be refused are ignored while the controller is off."""
    done = helm.template(
        "--set", "controller.renewDeadlineSeconds=15", "--set", "rbac.create=false"
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
