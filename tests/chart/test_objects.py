"""RBAC, ServiceAccount, the headless Service, and the optional ServiceMonitor and
NetworkPolicy, as rendered."""

from __future__ import annotations

from typing import Any

from tests.chart.support import NAMESPACE, Helm, Manifests, ports

POD_READ = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
EVENT_CREATE = {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}
DRA_GROUP, READ = ["resource.k8s.io"], ["list", "watch"]
# Claims by name only (those the node's pods name): never listed or watched.
CLAIM_READ = {"apiGroups": DRA_GROUP, "resources": ["resourceclaims"], "verbs": ["get"]}
SLICE_READ = {"apiGroups": DRA_GROUP, "resources": ["resourceslices"], "verbs": READ}
RULES = [*POD_READ, EVENT_CREATE, CLAIM_READ, SLICE_READ]
# A Role cannot grant cluster-scoped slices: the namespaced install has them apart.
NAMESPACED_RULES = [*POD_READ, EVENT_CREATE, CLAIM_READ]
# At shutdown (docs/upgrades.md): its own pod and DaemonSet, in the release namespace;
# its node, cluster-scoped. Get only, each.
SELF_READ = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
    {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["get"]},
]
NODE_READ = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]


def named(manifests: Manifests, kind: str, suffix: str = "") -> dict[str, Any]:
    """The one object of ``kind`` named the chart's full name plus ``suffix``."""
    (found,) = [o for o in manifests.of_kind(kind) if o["metadata"]["name"] == f"capwatch{suffix}"]
    return found


def test_default_objects(default: Manifests) -> None:
    """Defaults render a ServiceAccount, the agent's ClusterRole, its node's ClusterRole
    and its own Role (each with a binding), a Service and a DaemonSet, no more."""
    assert default.kinds() == sorted(
        [
            "ServiceAccount",
            *["ClusterRole", "ClusterRoleBinding"] * 2,
            "Role",
            "RoleBinding",
            "Service",
            "DaemonSet",
        ]
    )


def test_cluster_role_reads_pods_and_claims_and_creates_events_only(default: Manifests) -> None:
    """The ClusterRole grants exactly list/watch on core pods and resource.k8s.io slices,
    get on claims, and create on core events, bound to the chart's account."""
    role = named(default, "ClusterRole")
    assert role["rules"] == RULES
    binding = named(default, "ClusterRoleBinding")
    account = default.one("ServiceAccount")["metadata"]["name"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    ]
    assert default.pod_spec["serviceAccountName"] == account


def test_namespaced_rbac_is_a_role_with_the_same_rules(rendered: dict[str, Manifests]) -> None:
    """rbac.namespaced renders a Role and RoleBinding in the release namespace with the same
    rules but the slices, which only a ClusterRole of their own (list/watch of
    resourceslices, nothing else) can grant."""
    manifests = rendered["namespaced-monitored"]
    slices = named(manifests, "ClusterRole", "-slices")
    assert slices["rules"] == [SLICE_READ]
    slices_binding = named(manifests, "ClusterRoleBinding", "-slices")
    assert slices_binding["roleRef"]["name"] == slices["metadata"]["name"]
    role, binding = named(manifests, "Role"), named(manifests, "RoleBinding")
    assert role["rules"] == NAMESPACED_RULES
    assert role["metadata"]["namespace"] == NAMESPACE
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert binding["roleRef"]["kind"] == "Role"
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    # ...and the agent watches that namespace only, which is all a Role allows.
    (daemonset,) = manifests.of_kind("DaemonSet")
    (agent,) = [
        c for c in daemonset["spec"]["template"]["spec"]["containers"] if c["name"] == "agent"
    ]
    assert f"--pod-namespace={NAMESPACE}" in agent["args"]
    assert not any(
        a.startswith("--pod-namespace")
        for c in rendered["default"].one("DaemonSet")["spec"]["template"]["spec"]["containers"]
        for a in c.get("args", [])
    )


def test_no_agent_rbac_object_grants_more_than_reads_and_event_creation(
    rendered: dict[str, Manifests],
) -> None:
    """Across every variant, the agent's roles grant together exactly list/watch of pods
    and slices, get of claims, event create, and get of its own pod, DaemonSet and node
    (the controller's roles are test_controller's)."""
    for manifests in rendered.values():
        roles = [
            role
            for role in manifests.of_kind("Role") + manifests.of_kind("ClusterRole")
            if role["metadata"]["labels"]["app.kubernetes.io/component"] == "node-agent"
        ]
        assert len(roles) in (3, 4)
        granted = [rule for role in roles for rule in role["rules"]]
        assert sorted(granted, key=str) == sorted([*RULES, *SELF_READ, *NODE_READ], key=str)


def test_claims_off_drops_the_claim_and_slice_rules_and_says_so_to_the_agent(
    helm: Helm,
) -> None:
    """dra.claims false: no resource.k8s.io rule in either RBAC variant, no slices
    ClusterRole, and the agent is told not to read claims."""
    manifests = helm.render("--set", "dra.claims=false")
    assert named(manifests, "ClusterRole")["rules"] == [*POD_READ, EVENT_CREATE]
    assert "--dra-claims=false" in manifests.container("agent")["args"]
    namespaced = helm.render("--set", "dra.claims=false", "--set", "rbac.namespaced=true")
    assert [role["rules"] for role in namespaced.of_kind("ClusterRole")] == [NODE_READ]
    assert named(namespaced, "Role")["rules"] == [*POD_READ, EVENT_CREATE]


def test_the_sim_driver_adds_its_slice_rule_device_class_mounts_and_flags(helm: Helm) -> None:
    """dra.simDriver.enabled (sim backend): a ClusterRole of its own with create and
    patch of resourceslices (apply) and get of claims in every namespace (the kubelet's
    pods' claims), even with dra.claims off or a namespaced install; the DeviceClass
    sim.capwatch.io selecting the driver's devices; the kubelet's two directories
    mounted where the agent is told they are; nothing of it by default."""
    sim = ("--set", "agent.gpuBackend=sim", "--set", "dra.simDriver.enabled=true")
    manifests = helm.render(
        *sim, "--set", "dra.claims=false", "--set", "dra.simDriver.kubeletDir=/k"
    )
    slices = named(manifests, "ClusterRole", "-sim-driver")
    assert slices["rules"] == [
        {"apiGroups": DRA_GROUP, "resources": ["resourceslices"], "verbs": ["create", "patch"]},
        CLAIM_READ,
    ]
    assert (
        named(manifests, "ClusterRoleBinding", "-sim-driver")["roleRef"]["name"]
        == (slices["metadata"]["name"])
    )
    assert named(manifests, "ClusterRole")["rules"] == [*POD_READ, EVENT_CREATE]
    namespaced = helm.render(*sim, "--set", "rbac.namespaced=true")
    assert named(namespaced, "ClusterRole", "-sim-driver")["rules"] == slices["rules"]
    (device_class,) = manifests.of_kind("DeviceClass")
    assert device_class["metadata"]["name"] == "sim.capwatch.io"
    assert device_class["spec"]["selectors"] == [
        {"cel": {"expression": 'device.driver == "sim.capwatch.io"'}}
    ]
    agent = manifests.container("agent")
    assert {"--dra-sim-driver=true", "--kubelet-dir=/k"} <= set(agent["args"])
    mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    assert mounts["kubelet-plugins-registry"] == "/k/plugins_registry"
    assert mounts["kubelet-plugin"] == "/k/plugins/sim.capwatch.io"
    assert manifests.volume("kubelet-plugins-registry")["hostPath"] == {
        "path": "/k/plugins_registry",
        "type": "Directory",
    }
    assert manifests.volume("kubelet-plugin")["hostPath"]["path"] == "/k/plugins/sim.capwatch.io"
    default = helm.render("--set", "agent.gpuBackend=sim")
    assert not default.of_kind("DeviceClass")
    assert not any(a.startswith("--dra-sim-driver") for a in default.container("agent")["args"])


def test_pod_events_off_drops_the_event_rule_and_says_so_to_the_agent(helm: Helm) -> None:
    """agent.podEvents false: pod reads only, and the agent is told not to post Events."""
    manifests = helm.render("--set", "agent.podEvents=false")
    assert named(manifests, "ClusterRole")["rules"] == [*POD_READ, CLAIM_READ, SLICE_READ]
    assert "--pod-events=false" in manifests.container("agent")["args"]


def test_the_agent_reads_its_own_pod_daemonset_and_node_at_shutdown(
    rendered: dict[str, Manifests],
) -> None:
    """In every variant: a Role in the release namespace with get of pods and
    daemonsets, and a ClusterRole with get of nodes, both bound to the agent's account;
    the agent is given its pod's name and namespace by the downward API."""
    for manifests in rendered.values():
        account = manifests.pod_spec["serviceAccountName"]
        role = named(manifests, "Role", "-self")
        assert role["rules"] == SELF_READ
        assert role["metadata"]["namespace"] == NAMESPACE
        node = named(manifests, "ClusterRole", "-node")
        assert node["rules"] == NODE_READ
        for kind, target in (("RoleBinding", role), ("ClusterRoleBinding", node)):
            binding = named(manifests, kind, target["metadata"]["name"].removeprefix("capwatch"))
            assert binding["roleRef"]["name"] == target["metadata"]["name"]
            assert binding["subjects"] == [
                {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
            ]
        env = {e["name"]: e for e in manifests.container("agent")["env"]}
        assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        assert env["POD_NAMESPACE"]["valueFrom"] == {
            "fieldRef": {"fieldPath": "metadata.namespace"}
        }


def test_service_is_headless_over_every_agent(default: Manifests) -> None:
    """The Service is headless, lists NotReady agents too, selects the pods, names its ports."""
    service = default.one("Service")
    spec = service["spec"]
    assert spec["clusterIP"] == "None"
    assert spec["publishNotReadyAddresses"] is True
    pod_labels = default.one("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"].items() <= pod_labels.items()
    assert spec["ports"] == [
        {"name": "grpc", "port": 50051, "targetPort": "grpc", "protocol": "TCP"},
        {"name": "metrics", "port": 9400, "targetPort": "metrics", "protocol": "TCP"},
    ]


def test_service_monitor_scrapes_the_metrics_port(rendered: dict[str, Manifests]) -> None:
    """serviceMonitor.enabled renders a ServiceMonitor selecting the Service's metrics port."""
    manifests = rendered["namespaced-monitored"]
    monitor = manifests.one("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    service = manifests.one("Service")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics"
    assert endpoint["path"] == "/metrics"
    assert "metrics" in [p["name"] for p in service["spec"]["ports"]]


def test_service_monitor_is_off_by_default(rendered: dict[str, Manifests]) -> None:
    """Without serviceMonitor.enabled no ServiceMonitor renders."""
    assert not rendered["default"].of_kind("ServiceMonitor")
    assert not rendered["metrics-off"].of_kind("ServiceMonitor")


def test_network_policy_lets_in_the_probe_and_the_named_peers_only(
    rendered: dict[str, Manifests],
) -> None:
    """With networkPolicy on: the agent pods' ingress is the readiness port from anywhere,
    gRPC from grpcFrom and metrics from metricsFrom, by the containers' named ports."""
    manifests = rendered["tls-netpol"]
    policy = manifests.one("NetworkPolicy")
    selector = manifests.one("DaemonSet")["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["podSelector"] == {"matchLabels": selector}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    rules = policy["spec"]["ingress"]
    assert rules[0] == {"ports": [{"port": "readyz", "protocol": "TCP"}]}  # no from: anyone
    by_port = {rule["ports"][0]["port"]: rule["from"] for rule in rules[1:]}
    assert set(by_port) == {"grpc", "metrics"}
    assert by_port["grpc"][0]["podSelector"] == {
        "matchLabels": {"app.kubernetes.io/name": "capwatch-controller"}
    }
    assert by_port["metrics"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    named = {**ports(manifests.container("agent")), **ports(manifests.container("readyz"))}
    assert {"readyz", "grpc", "metrics"} <= set(named)


def test_network_policy_is_off_by_default_and_follows_metrics_off(
    rendered: dict[str, Manifests], helm: Helm
) -> None:
    """No policy by default; with metrics off the policy has no metrics rule, and with no
    peers named nothing but the probe gets in."""
    assert not rendered["default"].of_kind("NetworkPolicy")
    manifests = helm.render(
        "--set", "networkPolicy.enabled=true",
        "--set", "metrics.port=0",
        "--set-json", 'networkPolicy.metricsFrom=[{"podSelector": {}}]',
    )  # fmt: skip
    rules = manifests.one("NetworkPolicy")["spec"]["ingress"]
    assert rules == [{"ports": [{"port": "readyz", "protocol": "TCP"}]}]
