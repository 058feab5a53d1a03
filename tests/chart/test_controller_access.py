"""The chart's controller: how it reaches the agents (TLS), its Service, ServiceMonitor and
NetworkPolicy rule, its RBAC, the cleanup hook, and the values the schema and the render
checks refuse."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from capwatch.cli import _parser  # the real `capwatch` parser: what the image will accept
from capwatch.controller.kube import EVENT_NAMESPACE
from capwatch.controller.leasing import LeaseConfig
from capwatch.controller.settings import controller_settings
from capwatch.kit.errors import ConfigError
from tests.chart.controller_support import (
    CLEANUP,
    NAME,
    RESTRICTED,
    SCHEMA_ERROR,
    _container,
    _grants,
    _matches,
    _named,
    _pod_labels,
    _pod_spec,
    _settings,
    _statefulset,
)
from tests.chart.support import NAMESPACE, RELEASE, Helm, Manifests


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


def test_controller_rbac_is_bound_to_its_own_account(enabled: Manifests, tls: Manifests) -> None:
    """A ClusterRole and a Role in the release namespace, each bound (by a binding of the
    same name) to the controller's own account, which is not the agents'; the rules do not
    depend on the other values. What the rules must be is not written down here: that
    each grant is needed and that together they suffice is proven on a real API server
    (tests/realkube/test_rbac.py)."""
    cluster_role = _named(enabled, "ClusterRole", NAME)
    role = _named(enabled, "Role", NAME)
    assert role["metadata"]["namespace"] == NAMESPACE
    assert "namespace" not in cluster_role["metadata"]
    assert _grants(cluster_role)
    assert _grants(role)
    assert not _grants(cluster_role) & _grants(role)  # each grant from one role only
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
    # TLS, two shards and monitoring change nothing the controller may do.
    for kind in ("ClusterRole", "Role"):
        assert _named(tls, kind, NAME)["rules"] == _named(enabled, kind, NAME)["rules"]
    # Node Events go to another namespace than the release's: their grant cannot be the
    # Role's (tests/realkube/test_rbac.py shows which grant the Event needs).
    assert EVENT_NAMESPACE != NAMESPACE


def test_no_role_anywhere_deletes_or_escalates(
    rendered: dict[str, Manifests], enabled: Manifests
) -> None:
    """No rendered role, the controller's and the hook's included, grants delete (but of the
    DeviceTaintRules capwatch keeps), a wildcard, secrets, or anything on RBAC objects."""
    for manifests in [*rendered.values(), enabled]:
        for role in manifests.of_kind("Role") + manifests.of_kind("ClusterRole"):
            for rule in role["rules"]:
                forbidden = {"deletecollection", "*", "escalate", "bind", "impersonate"}
                assert not forbidden & set(rule["verbs"])
                if "delete" in rule["verbs"]:
                    assert rule["resources"] == ["devicetaintrules"], rule
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
    created before it (granting only what the controller's ClusterRole grants too), all
    deleted by Helm once it succeeds and before a new one is made."""
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
    # The hook does a part of the controller's job (find the nodes, patch their status):
    # nothing the controller may not do itself; the exact grants are proven on a real API
    # server (tests/realkube/test_rbac.py).
    assert _grants(role)
    assert _grants(role) <= _grants(_named(enabled, "ClusterRole", NAME))
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
