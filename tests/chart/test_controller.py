"""The cluster controller as rendered (controller.enabled): the StatefulSet and its flags as
the real ``capwatch controller`` reads them, the Service, the RBAC rule by rule, the cleanup
hook, and the values the chart refuses."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from capwatch.controller.cluster.serving import ClusterServer
from capwatch.controller.leasing import LeaseConfig
from capwatch.kube.wire import WRITE_TIMEOUT_S
from capwatch.server.http.readyz import PATH as READYZ_PATH
from tests.chart.controller_support import (
    AGENT_SELECTOR,
    NAME,
    RESTRICTED,
    SCHEMA_ERROR,
    _container,
    _controller_env_twins,
    _flag,
    _matches,
    _named,
    _pod_labels,
    _pod_spec,
    _selector_terms,
    _settings,
    _statefulset,
)
from tests.chart.support import CHART, NAMESPACE, RELEASE, Helm, Manifests, ports


def test_controller_is_off_by_default(rendered: dict[str, Manifests]) -> None:
    """Without controller.enabled no variant but the controller's renders a controller
    object, so existing installs get no StatefulSet, Job, Role or second Service."""
    for variant, manifests in rendered.items():
        has = [o["kind"] for o in manifests if "controller" in o["metadata"]["name"]]
        assert bool(has) == (variant == "controller-tls"), (variant, has)


def test_controller_objects(enabled: Manifests, rendered: dict[str, Manifests]) -> None:
    """controller.enabled adds exactly: its StatefulSet, Service, ServiceAccount, ClusterRole
    and Role with bindings, the cleanup hook (its own account, role, binding and Job), and
    the fencing policies with their bindings (the identity check and one per shard)."""
    agent_kinds = rendered["default"].kinds()
    added = sorted(enabled.kinds())
    for kind in agent_kinds:
        added.remove(kind)
    controller = ["StatefulSet", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"]
    hook = ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job"]
    fencing = ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"] * 2
    assert added == sorted([*controller, "Role", "RoleBinding", *hook, *fencing])
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
        assert settings.lease_name == f"{NAME}-{ordinal % 2}-of-2"
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
        "requests": {"cpu": "150m", "memory": "640Mi"},
        "limits": {"memory": "1536Mi"},
    }
    assert _container(enabled)["image"] == enabled.container("agent")["image"]


def test_grace_period_covers_the_clean_stop(enabled: Manifests, helm: Helm) -> None:
    """30 s by default; the chart refuses a grace period that does not exceed the clean stop
    (the stream's stop grace, the writes in flight, one Lease release attempt) and accepts
    one second more."""
    assert _pod_spec(enabled)["terminationGracePeriodSeconds"] == 30
    lease = LeaseConfig()
    server_grace = inspect.signature(ClusterServer.stop).parameters["grace_s"].default
    stop = server_grace + min(lease.renew_deadline_s, WRITE_TIMEOUT_S) + lease.attempt_timeout_s
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
