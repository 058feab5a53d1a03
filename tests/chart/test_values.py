"""Values the chart refuses (schema and render-time checks), and values it honours."""

from __future__ import annotations

import re
import tomllib

import pytest
import yaml

from tests.chart.support import CHART, ROOT, Helm

SCHEMA_ERROR = "values don't meet the specifications of the schema"
GRACE_MESSAGE = "terminationGracePeriodSeconds must be at least 60, got 30"


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (("--set-string", "grpc.port=50051"), "/grpc/port"),
        (("--set", "grpc.port=0"), "/grpc/port"),
        (("--set", "grpc.port=65536"), "/grpc/port"),
        (("--set", "metrics.port=-1"), "/metrics/port"),
        (("--set", "metrics.port=65536"), "/metrics/port"),
        (("--set-string", "metrics.port=9400"), "/metrics/port"),
        (("--set", "terminationGracePeriodSeconds=30"), "/terminationGracePeriodSeconds"),
        (("--set", "grpc.socketGroup=0"), "/grpc/socketGroup"),
        (("--set", "grpc.reservedLocalSubscribers=-1"), "/grpc/reservedLocalSubscribers"),
        (("--set", "grpc.maxStreamsPerPeer=0"), "/grpc/maxStreamsPerPeer"),
        (("--set", "agent.logFormat=xml"), "/agent/logFormat"),
        (("--set", "agent.interval=0"), "/agent/interval"),
        (("--set", "dra.deviceName=gpu"), "/dra/deviceName"),
        (("--set-string", "agent.xidIgnore=13;31"), "/agent/xidIgnore"),
        (("--set-string", "agent.xidFatal=all"), "/agent/xidFatal"),
        (("--set", "agent.faultRecoverySeconds=0"), "/agent/faultRecoverySeconds"),
        (("--set", "image.pullPolicy=Sometimes"), "/image/pullPolicy"),
        (("--set", "rbac.namespaced=yes"), "/rbac/namespaced"),
        (("--set", "agnet.interval=5"), "agnet"),
        (("--set", "grpc.tls.clientCA.key="), "/grpc/tls/clientCA/key"),
        (("--set", "grpc.tls.secretname=x"), "secretname"),
    ],
)
def test_schema_rejects_bad_values(helm: Helm, args: tuple[str, ...], where: str) -> None:
    """The schema rejects wrong types, out-of-range ports and unknown keys, naming the key."""
    done = helm.template(*args)
    assert done.returncode != 0
    assert SCHEMA_ERROR in done.stderr
    assert where in done.stderr


def test_short_grace_period_fails_rendering_with_the_reason(helm: Helm) -> None:
    """Past the schema, the template itself refuses a grace period under 60 and says why."""
    done = helm.template("--set", "terminationGracePeriodSeconds=30", "--skip-schema-validation")
    assert done.returncode != 0
    assert GRACE_MESSAGE in done.stderr
    assert "restores the default power limit" in done.stderr


def test_longer_grace_period_is_honoured(helm: Helm) -> None:
    """A grace period above the minimum reaches the pod spec unchanged."""
    manifests = helm.render("--set", "terminationGracePeriodSeconds=90")
    assert manifests.pod_spec["terminationGracePeriodSeconds"] == 90


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--set", "serviceMonitor.enabled=true", "--set", "metrics.port=0"),
            "serviceMonitor.enabled needs metrics",
        ),
        (
            ("--set", "agent.shutdownGraceSeconds=56"),
            "agent.shutdownGraceSeconds + grpc.graceSeconds (61) must be less than "
            "terminationGracePeriodSeconds (60)",
        ),
        (
            ("--set", "grpc.maxSubscribers=16"),
            "grpc.reservedLocalSubscribers (16) must be less than grpc.maxSubscribers (16)",
        ),
        (("--set", "metrics.port=50051"), "must all differ"),
        (("--set", "grpc.port=8081"), "must all differ"),
        (
            ("--set", "grpc.tls.clientCA.secretName=ca"),
            "grpc.tls.clientCA.secretName needs grpc.tls.secretName",
        ),
        (
            ("--set", "dra.simDriver.enabled=true"),
            "dra.simDriver.enabled needs agent.gpuBackend sim, got nvml",
        ),
    ],
)
def test_inconsistent_values_fail_rendering(
    helm: Helm, args: tuple[str, ...], message: str
) -> None:
    """Values that pass the schema but contradict each other fail with a message naming them."""
    done = helm.template(*args)
    assert done.returncode != 0
    assert SCHEMA_ERROR not in done.stderr
    assert message in done.stderr


def test_values_reach_the_agent_flags(helm: Helm) -> None:
    """Interval, watts, annotation key, DRA names, ports, group and stream limits reach
    flags and ports."""
    manifests = helm.render(
        "--set-json", "agent.interval=2.5",
        "--set", "agent.safeDefaultWatts=250",
        "--set", "agent.annotationKey=example.com/watts",
        "--set", "dra.poolName=pool-a",
        "--set", "dra.deviceName=nvidia-{uuid}",
        "--set", "grpc.port=50100",
        "--set", "grpc.socketGroup=3000",
        "--set", "metrics.port=9500",
        "--set", "grpc.reservedLocalSubscribers=4",
        "--set", "grpc.maxStreamsPerPeer=500",
        "--set", "agent.extraArgs={--log-level=debug}",
    )  # fmt: skip
    agent = manifests.container("agent")
    for flag in (
        "--interval=2.5",
        "--safe-default-watts=250",
        "--annotation-key=example.com/watts",
        "--dra-pool-name=pool-a",
        "--dra-device-name=nvidia-{uuid}",
        "--grpc-listen=0.0.0.0:50100",
        "--grpc-socket-group=3000",
        "--metrics-port=9500",
        "--grpc-reserved-local-subscribers=4",
        "--grpc-max-streams-per-peer=500",
    ):
        assert flag in agent["args"]
    assert agent["args"][-1] == "--log-level=debug"
    assert {p["name"]: p["containerPort"] for p in agent["ports"]} == {
        "grpc": 50100,
        "metrics": 9500,
    }
    assert manifests.pod_spec["securityContext"]["fsGroup"] == 3000
    assert manifests.container("readyz")["securityContext"]["runAsGroup"] == 3000
    assert [p["port"] for p in manifests.one("Service")["spec"]["ports"]] == [50100, 9500]


def test_optional_scheduling_values(helm: Helm) -> None:
    """affinity, runtimeClassName and an empty priorityClassName are honoured."""
    manifests = helm.render(
        "--set", "priorityClassName=",
        "--set", "runtimeClassName=nvidia",
        "--set", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].key=gpu",
        "--set", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
    )  # fmt: skip
    spec = manifests.pod_spec
    assert "priorityClassName" not in spec
    assert spec["runtimeClassName"] == "nvidia"
    assert "nodeAffinity" in spec["affinity"]


def test_rbac_and_service_account_can_be_left_to_the_operator(helm: Helm) -> None:
    """rbac.create and serviceAccount.create false render neither, and name the given account."""
    manifests = helm.render(
        "--set", "rbac.create=false",
        "--set", "serviceAccount.create=false",
        "--set", "serviceAccount.name=gpu-agents",
    )  # fmt: skip
    assert manifests.kinds() == ["DaemonSet", "Service"]
    assert manifests.pod_spec["serviceAccountName"] == "gpu-agents"


def test_chart_app_version_matches_the_package_version() -> None:
    """Chart.yaml's appVersion (the default image tag) is pyproject.toml's version."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == project["version"]


def test_schema_is_draft_07_with_the_documented_bounds() -> None:
    """values.schema.json is draft-07; grace >= 60, ports 1..65535, metrics port 0..65535."""
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    props = schema["properties"]
    assert props["terminationGracePeriodSeconds"]["minimum"] == 60
    grpc_port = props["grpc"]["properties"]["port"]
    assert (grpc_port["type"], grpc_port["minimum"], grpc_port["maximum"]) == ("integer", 1, 65535)
    metrics_port = props["metrics"]["properties"]["port"]
    assert (metrics_port["minimum"], metrics_port["maximum"]) == (0, 65535)


def test_readme_documents_every_top_level_value() -> None:
    """The chart README's values table names every key in values.yaml (nested keys dotted)."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()
    documented = set(re.findall(r"^\| `([A-Za-z0-9_.]+)` \|", readme, flags=re.MULTILINE))

    def leaves(prefix: str, node: object) -> list[str]:
        if isinstance(node, dict) and node and prefix not in _WHOLE:
            return [k for key, v in node.items() for k in leaves(f"{prefix}{key}.", v)]
        return [prefix.rstrip(".")]

    missing = sorted(set(leaves("", values)) - documented)
    assert missing == []


# Maps documented as one value rather than key by key.
_WHOLE = {
    "agent.resources.",
    "readyz.resources.",
    "nodeSelector.",
    "affinity.",
    "podAnnotations.",
    "podLabels.",
    "service.annotations.",
    "service.labels.",
    "serviceMonitor.labels.",
    "serviceAccount.annotations.",
    "controller.resources.",
    "controller.nodeSelector.",
    "controller.affinity.",
    "controller.podAnnotations.",
    "controller.podLabels.",
    "controller.service.annotations.",
    "controller.service.labels.",
    "controller.serviceAccount.annotations.",
}
