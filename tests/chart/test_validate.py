"""Every rendered object validates offline against Kubernetes' own schemas, strictly.

kubernetes-validate ships the OpenAPI-derived JSON schemas of Kubernetes 1.25
to 1.37 (version 1.37.0 of the package). The chart is checked against the
oldest release it supports (Chart.yaml's kubeVersion floor, 1.32) and the
newest the validator knows. Strict mode rejects unknown fields, which catches
misspelt or misplaced keys the API server would otherwise drop silently.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.chart.support import CHART, VARIANTS, Manifests

KUBE_VERSIONS = ("1.32.0", "1.37.0")
# CRD kinds: kubernetes-validate has schemas for built-in kinds only, and the
# Prometheus Operator's CRD schemas are not available offline. These are skipped
# (and test_crd_kinds_have_no_offline_schema proves the skip hides nothing).
NO_OFFLINE_SCHEMA = frozenset(
    {
        ("monitoring.coreos.com/v1", "ServiceMonitor"),
        # Its rules are checked by promtool instead (tests/chart/test_prometheusrule.py).
        ("monitoring.coreos.com/v1", "PrometheusRule"),
    }
)


def _validate(obj: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_rendered_objects_validate_strictly(
    rendered: dict[str, Manifests], variant: str, version: str
) -> None:
    """Each built-in object of each values variant is valid Kubernetes with no unknown fields."""
    checked = []
    for obj in rendered[variant]:
        if (obj["apiVersion"], obj["kind"]) in NO_OFFLINE_SCHEMA:
            continue
        try:
            _validate(obj, version)
        except kubernetes_validate.ValidationError as exc:
            path = "/".join(str(p) for p in exc.path)
            pytest.fail(f"{variant}: {obj['kind']} invalid for {version} at {path}: {exc.message}")
        checked.append(obj["kind"])
    assert "DaemonSet" in checked
    assert "Service" in checked


def test_crd_kinds_have_no_offline_schema(rendered: dict[str, Manifests]) -> None:
    """The skipped kinds really have no offline schema, and each is rendered by some variant."""
    seen = {(o["apiVersion"], o["kind"]) for m in rendered.values() for o in m}
    assert seen >= NO_OFFLINE_SCHEMA
    for api_version, kind in NO_OFFLINE_SCHEMA:
        obj = {"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}}
        with pytest.raises(kubernetes_validate.SchemaNotFoundError):
            _validate(obj, KUBE_VERSIONS[0])


def test_strict_validation_catches_a_misplaced_field(default: Manifests) -> None:
    """The validator is strict: a misplaced probe key and a string port are both refused."""
    daemonset = default.one("DaemonSet")
    misplaced = copy.deepcopy(daemonset)
    shim = misplaced["spec"]["template"]["spec"]["containers"][1]
    shim["readinessProbe"]["path"] = "/readyz"  # belongs under httpGet
    with pytest.raises(kubernetes_validate.ValidationError, match="'path' was unexpected"):
        _validate(misplaced, KUBE_VERSIONS[0])
    string_port = copy.deepcopy(daemonset)
    string_port["spec"]["template"]["spec"]["containers"][1]["ports"][0]["containerPort"] = "8081"
    with pytest.raises(kubernetes_validate.ValidationError, match="not of type 'integer'"):
        _validate(string_port, KUBE_VERSIONS[0])


def test_oldest_validated_version_is_the_charts_floor() -> None:
    """Chart.yaml's kubeVersion floor is the oldest Kubernetes the objects are validated against."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    floor = re.fullmatch(r">=(\d+\.\d+)\.\d+(-0)?", chart["kubeVersion"])
    assert floor is not None
    assert KUBE_VERSIONS[0].startswith(floor.group(1) + ".")
