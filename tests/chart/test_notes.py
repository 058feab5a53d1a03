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
