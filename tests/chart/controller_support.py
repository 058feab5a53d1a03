"""What the chart's controller tests share: the rendered variants, the objects' lookups,
a role's rules as single grants, and the real controller settings.

No list of the rules the controller and its cleanup hook should be granted lives here:
what each component calls, and that each rendered grant is both needed and enough, is
proven against a real API server with its audit log (tests/realkube/test_rbac.py). The
chart tests check what a render alone can tell: who is bound to what, where, and how
the roles relate.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from capwatch.cli import _parser  # the real `capwatch` parser: what the image will accept
from capwatch.controller.settings import ControllerSettings, controller_settings
from tests.chart.support import NAMESPACE, RELEASE, Manifests
from tests.pem import write_certificate, write_key

SCHEMA_ERROR = "values don't meet the specifications of the schema"
NAME = f"{RELEASE}-controller"
CLEANUP = f"{RELEASE}-controller-cleanup"
AGENT_SELECTOR = (
    "app.kubernetes.io/name=capwatch,app.kubernetes.io/component=node-agent,"
    f"app.kubernetes.io/instance={RELEASE}"
)
RESTRICTED = {
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "runAsGroup": 65532,
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _named(manifests: Manifests, kind: str, name: str) -> dict[str, Any]:
    found = [o for o in manifests.of_kind(kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def _grants(role: Mapping[str, Any]) -> set[tuple[str, str, str]]:
    """A rendered (Cluster)Role's rules as single (apiGroup, resource, verb) grants."""
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def _statefulset(manifests: Manifests) -> dict[str, Any]:
    return manifests.one("StatefulSet")


def _pod_spec(manifests: Manifests) -> dict[str, Any]:
    spec: dict[str, Any] = _statefulset(manifests)["spec"]["template"]["spec"]
    return spec


def _container(manifests: Manifests) -> dict[str, Any]:
    (container,) = _pod_spec(manifests)["containers"]
    assert container["name"] == "controller"
    return container


def _pod_labels(manifests: Manifests, kind: str) -> dict[str, str]:
    labels: dict[str, str] = manifests.one(kind)["spec"]["template"]["metadata"]["labels"]
    return labels


def _matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return selector.items() <= labels.items()


def _selector_terms(text: str) -> dict[str, str]:
    terms = dict(term.split("=", 1) for term in text.split(","))
    assert len(terms) == len(text.split(",")), f"a key repeats in {text}"
    return terms


def _flag(container: Mapping[str, Any], flag: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in container["args"] if a.startswith(f"{flag}=")]
    return value


def pod_uid(pod_name: str) -> str:
    """A stand-in for the UID the API server gives pod ``pod_name``."""
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, pod_name))


def _env(container: Mapping[str, Any], pod_name: str) -> dict[str, str]:
    """The container's environment as the kubelet fills it in for pod ``pod_name``."""
    fields = {
        "metadata.name": pod_name,
        "metadata.namespace": NAMESPACE,
        "metadata.uid": pod_uid(pod_name),
    }
    env = {}
    for var in container.get("env", []):
        if "valueFrom" in var:
            env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[var["name"]] = var.get("value", "")
    return env


def _settings(
    container: Mapping[str, Any], pod_name: str, files: Path | None = None
) -> ControllerSettings:
    """The container's args and env through the real parser and settings; TLS files, which
    exist only in the pod, are made under ``files`` with the same names."""
    args = list(container["args"])
    if files is not None:
        for i, arg in enumerate(args):
            if arg.startswith("--agent-tls-") and "=/etc/capwatch/" in arg:
                flag, path = arg.split("=", 1)
                local = files / path.removeprefix("/etc/capwatch/")
                local.parent.mkdir(parents=True, exist_ok=True)
                # Real PEM: the settings load them as grpc will.
                (write_key if flag == "--agent-tls-key" else write_certificate)(local)
                args[i] = f"{flag}={local}"
    namespace = _parser().parse_args(args)
    assert namespace.command == "controller"
    return controller_settings(namespace, _env(container, pod_name))


def _controller_env_twins(capsys: pytest.CaptureFixture[str]) -> set[str]:
    """Every environment twin `capwatch controller --help` declares."""
    with pytest.raises(SystemExit):
        _parser().parse_args(["controller", "--help"])
    return set(re.findall(r"\[env\s+([A-Z0-9_]+);", capsys.readouterr().out))


# --- off by default ----------------------------------------------------------------------
