"""NOTES.txt, as `helm install` prints it: how to check readiness, watch the stream, scrape."""

from __future__ import annotations

from capwatch.cli import _parser  # the real `capwatch` parser
from capwatch.controller.conditions import CONDITION_TYPE
from capwatch.controller.kube import COMPONENT, EVENT_NAMESPACE
from capwatch.controller.settings import controller_settings
from tests.chart.support import CHART, NAMESPACE, RELEASE, Helm


def _notes(helm: Helm, *args: str) -> str:
    done = helm.run(
        "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client", *args
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split("NOTES:", 1)[1]


def test_notes_say_how_to_check_rollout_stream_and_metrics(helm: Helm) -> None:
    """The default notes give the rollout, /readyz, watch, grpcurl and metrics commands."""
    notes = _notes(helm)
    for needle in (
        f"kubectl -n {NAMESPACE} rollout status daemonset/{RELEASE}",
        "'/readyz'",
        "port-forward POD 50051:50051",
        "capwatch watch --target localhost:50051",
        "grpcurl -plaintext localhost:50051 list",
        "localhost:9400/metrics",
        "Rollout coupling",
    ):
        assert needle in notes
    assert "WARNING" not in notes


def test_notes_follow_the_values(helm: Helm) -> None:
    """Metrics off says so; namespaced RBAC says the agent watches one namespace only."""
    off = _notes(helm, "--set", "metrics.port=0")
    assert "Metrics are disabled" in off
    assert "/metrics" not in off
    namespaced = _notes(helm, "--set", "rbac.namespaced=true")
    assert "watches pods in" in namespaced
    assert "safe default" in namespaced


def test_notes_with_tls_show_tls_commands(helm: Helm) -> None:
    """With grpc.tls the stream commands use the CA (and a client certificate for mutual
    TLS) instead of plaintext."""
    tls = _notes(helm, "--set", "grpc.tls.secretName=capwatch-grpc-tls")
    assert "TLS with the certificate in Secret capwatch-grpc-tls)" in tls
    assert "--tls-ca ca.crt --tls-server-name NAME" in tls
    assert "grpcurl -cacert ca.crt -servername NAME localhost:50051 list" in tls
    assert "-plaintext" not in tls
    mutual = _notes(
        helm,
        "--set", "grpc.tls.secretName=capwatch-grpc-tls",
        "--set", "grpc.tls.clientCA.secretName=capwatch-client-ca",
    )  # fmt: skip
    assert "signed by the CA in Secret capwatch-client-ca" in mutual
    assert "--tls-ca ca.crt --tls-cert client.crt --tls-key client.key" in mutual
    assert "grpcurl -cacert ca.crt -cert client.crt -key client.key -servername NAME" in mutual


def _lease_names(shards: int) -> list[str]:
    """The Lease of each shard, as the real `capwatch controller` names it."""
    names = []
    for index in range(shards):
        args = _parser().parse_args(["controller", f"--shards={shards}", f"--shard-index={index}"])
        names.append(controller_settings(args, {"POD_NAMESPACE": NAMESPACE}).lease_name)
    return names


def test_notes_show_the_cluster_controller_when_it_runs(helm: Helm) -> None:
    """With the controller: its rollout, the node condition, its Events, each shard's Lease
    by the name the controller uses, and the cluster stream at its Service and per shard."""
    notes = _notes(helm, "--set", "controller.enabled=true", "--set", "controller.shards=2")
    service = f"{RELEASE}-controller"
    for needle in (
        f"kubectl -n {NAMESPACE} rollout status statefulset/{service}",
        "kubectl describe node NODE",
        f'?(@.type=="{CONDITION_TYPE}")',
        f"--field-selector involvedObject.kind=Node,source={COMPONENT}",
        f"kubectl -n {EVENT_NAMESPACE} get events",
        f"get leases {' '.join(_lease_names(2))} -o",
        f"capwatch watch --cluster --target {service}.{NAMESPACE}.svc:50052",
        f"--target {service}-K.{service}.{NAMESPACE}.svc:50052",
        "grpcurl -plaintext localhost:50052 capwatch.v1.ClusterHealthService/GetClusterSnapshot",
        "post-delete",
    ):
        assert needle in notes, needle
    one_shard = _notes(helm, "--set", "controller.enabled=true")
    assert "-K." not in one_shard
    assert f"get leases {_lease_names(1)[0]} -o" in one_shard


def test_notes_say_nothing_of_a_controller_that_is_off(helm: Helm) -> None:
    """Without controller.enabled the notes have no controller section."""
    notes = _notes(helm)
    assert "cluster controller" not in notes
    assert "statefulset" not in notes
