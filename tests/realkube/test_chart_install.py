"""The chart installed for real: ``helm install`` of every values variant into the real
kube-apiserver, whose own validation and defaulting accept every object.

The offline schema check (tests/chart/test_validate.py) stays the fast first line;
this is the real server's word. The post-delete hook's objects are not created by an
install, so they are sent as server-side dry runs (validated and defaulted, not kept).
The prometheus-operator CRDs (ServiceMonitor, PrometheusRule) are not available here:
they stand in as schemaless CRDs, so the server checks those objects' kind, version
and metadata, and the offline check and the promtool tests their content.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import yaml

from tests.chart.support import CHART, RELEASE, VARIANTS, Helm
from tests.realkube.access import ApiError
from tests.realkube.controlplane import ControlPlane

HOOK = "helm.sh/hook"
MONITORING = {"ServiceMonitor": "servicemonitors", "PrometheusRule": "prometheusrules"}
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
INSTALLS = {**VARIANTS, "controller": ("--set", "controller.enabled=true")}


def _crd(kind: str, plural: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "listKind": f"{kind}List"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def monitoring_crds(realkube: ControlPlane) -> None:
    """ServiceMonitor and PrometheusRule served (schemaless) for the monitored variants."""
    names = []
    for kind, plural in MONITORING.items():
        body = _crd(kind, plural)
        try:
            realkube.request(
                "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body
            )
        except ApiError as err:
            if err.status != 409:
                raise
        names.append(body["metadata"]["name"])
    deadline = time.monotonic() + 30
    for name in names:
        path = f"{CRDS}/{name}"
        while not _established(realkube.request("GET", path)):
            assert time.monotonic() < deadline, f"CRD {name} never became Established"
            time.sleep(0.2)


def _established(crd: dict[str, Any]) -> bool:
    conditions = crd.get("status", {}).get("conditions", [])
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def _path(realkube: ControlPlane, obj: dict[str, Any], namespace: str) -> str:
    """The collection an object is created in: its plural and scope from the server's
    own discovery of its apiVersion (so a new kind in the chart needs no table here)."""
    group_version, kind = obj["apiVersion"], obj["kind"]
    prefix = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
    served = realkube.request("GET", prefix)["resources"]
    found = [r for r in served if r["kind"] == kind and "/" not in r["name"]]
    assert found, f"{group_version} serves no {kind}"
    scope = f"/namespaces/{namespace}" if found[0]["namespaced"] else ""
    return f"{prefix}{scope}/{found[0]['name']}"


def _install(helm: Helm, realkube: ControlPlane, namespace: str, args: tuple[str, ...]) -> None:
    done = helm.run(
        "install", RELEASE, str(CHART), "--namespace", namespace,
        "--kubeconfig", str(realkube.kubeconfig), *args,
    )  # fmt: skip
    assert done.returncode == 0, f"helm install {' '.join(args)} failed:\n{done.stderr}"


def _uninstall(helm: Helm, realkube: ControlPlane, namespace: str) -> None:
    # Without a kube-controller-manager the post-delete hook's Job would never finish.
    helm.run(
        "uninstall", RELEASE, "--namespace", namespace, "--no-hooks",
        "--kubeconfig", str(realkube.kubeconfig),
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("variant", list(INSTALLS))
def test_every_variant_installs_into_the_real_server(
    variant: str,
    helm: Helm,
    realkube: ControlPlane,
    realkube_namespace: str,
    monitoring_crds: None,
) -> None:
    """``helm install`` of the variant succeeds (every object passes the real server's
    validation and admission), each rendered object then exists with the server's
    defaults filled in, and the hook objects pass a server-side dry run."""
    args = INSTALLS[variant]
    rendered = helm.run("template", RELEASE, str(CHART), "--namespace", realkube_namespace, *args)
    assert rendered.returncode == 0, rendered.stderr
    objects = [o for o in yaml.safe_load_all(rendered.stdout) if o]
    for namespace in {o["metadata"].get("namespace") for o in objects} - {None}:
        _ensure_namespace(realkube, namespace)  # a value may place an object elsewhere
    try:
        _install(helm, realkube, realkube_namespace, args)
        for obj in objects:
            name = obj["metadata"]["name"]
            where = obj["metadata"].get("namespace", realkube_namespace)
            if HOOK in (obj["metadata"].get("annotations") or {}):
                dry = realkube.request(
                    "POST", _path(realkube, obj, realkube_namespace) + "?dryRun=All", obj
                )
                assert dry["metadata"]["name"] == name
                continue
            stored = realkube.request("GET", f"{_path(realkube, obj, where)}/{name}")
            assert stored["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
            _assert_defaulted(stored)
    finally:
        _uninstall(helm, realkube, realkube_namespace)


def _ensure_namespace(realkube: ControlPlane, name: str) -> None:
    try:
        realkube.create_namespace(name)
    except ApiError as err:
        if err.status != 409:
            raise


def _assert_defaulted(stored: dict[str, Any]) -> None:
    """What only the server adds: the workloads' pod templates come back defaulted."""
    if stored["kind"] not in {"DaemonSet", "StatefulSet", "Job"}:
        return
    pod = stored["spec"]["template"]["spec"]
    assert pod["restartPolicy"] in {"Always", "Never", "OnFailure"}
    assert pod["dnsPolicy"] == "ClusterFirst"
    assert pod["schedulerName"] == "default-scheduler"
    for container in pod["containers"]:
        assert container["terminationMessagePath"] == "/dev/termination-log"
        assert container["imagePullPolicy"] in {"Always", "IfNotPresent", "Never"}
