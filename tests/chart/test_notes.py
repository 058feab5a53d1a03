"""NOTES.txt, as `helm install` prints it: how to check readiness, watch the stream, scrape."""

from __future__ import annotations

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
