"""The Grafana dashboard ConfigMap (grafanaDashboard.*): off by default; on, it carries
the sidecar's label and exactly the committed dashboard JSON."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dashboards.capwatch import COMMITTED, UID
from tests.chart.support import NAMESPACE, Helm, Manifests

SCHEMA_ERROR = "values don't meet the specifications of the schema"
CONFIGMAP_LIMIT = 1024 * 1024  # the API server's limit on a ConfigMap's data


def dashboards(manifests: Manifests) -> list[dict[str, Any]]:
    return [
        obj
        for obj in manifests.of_kind("ConfigMap")
        if obj["metadata"]["labels"].get("app.kubernetes.io/component") == "dashboard"
    ]


def test_no_dashboard_by_default(rendered: dict[str, Manifests]):
    """Only the variant that turns it on renders a dashboard ConfigMap."""
    found = {name: len(dashboards(m)) for name, m in rendered.items()}
    assert found.pop("grafana-dashboard") == 1
    assert set(found.values()) == {0}


def test_configmap_holds_the_committed_json(rendered: dict[str, Manifests]):
    """The ConfigMap's one key is the committed file, byte for byte, small enough for a
    ConfigMap; the sidecar label, the namespace override and the folder annotation are on."""
    (configmap,) = dashboards(rendered["grafana-dashboard"])
    metadata = configmap["metadata"]
    assert metadata["name"] == "capwatch-dashboard"
    assert metadata["namespace"] == "monitoring"
    assert metadata["labels"]["grafana_dashboard"] == "1"
    assert metadata["annotations"] == {"grafana_folder": "GPU"}
    assert list(configmap["data"]) == ["capwatch.json"]
    text = configmap["data"]["capwatch.json"]
    assert text == COMMITTED.read_text()
    assert json.loads(text)["uid"] == UID
    assert len(text.encode()) < CONFIGMAP_LIMIT


def test_label_and_namespace_follow_the_values(helm: Helm):
    """The label key and value are the sidecar's to choose; no namespace: the release's;
    no annotations: none."""
    manifests = helm.render(
        "--set",
        "grafanaDashboard.enabled=true",
        "--set",
        "grafanaDashboard.label=example.com/dashboard",
        "--set-string",
        "grafanaDashboard.labelValue=capwatch",
    )
    (configmap,) = dashboards(manifests)
    metadata = configmap["metadata"]
    assert metadata["namespace"] == NAMESPACE
    assert metadata["labels"]["example.com/dashboard"] == "capwatch"
    assert "grafana_dashboard" not in metadata["labels"]
    assert "annotations" not in metadata


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (("--set", "grafanaDashboard.enabled=yes"), "/grafanaDashboard/enabled"),
        (("--set", "grafanaDashboard.label=bad label"), "/grafanaDashboard/label"),
        (("--set", "grafanaDashboard.labelValue=1"), "/grafanaDashboard/labelValue"),
        (("--set", "grafanaDashboard.namespace=Monitoring"), "/grafanaDashboard/namespace"),
        (("--set", "grafanaDashboard.annotations.folder=1"), "/grafanaDashboard/annotations"),
        (("--set", "grafanaDashboard.folder=GPU"), "folder"),
    ],
)
def test_schema_rejects_bad_dashboard_values(helm: Helm, args: tuple[str, ...], where: str):
    """Wrong types, label keys and namespaces Kubernetes would refuse, and unknown keys are
    refused by the schema, naming the key."""
    done = helm.template("--set", "grafanaDashboard.enabled=true", *args)
    assert done.returncode != 0
    assert SCHEMA_ERROR in done.stderr
    assert where in done.stderr
