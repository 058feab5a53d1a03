"""The chart's RBAC in a real API server: rendered for a test's namespace, applied as admin,
read as single grants, one grant taken away at a time; the chart's ServiceAccounts' tokens.

A :class:`Release` is ``helm template`` of the chart (controller on) as release NAME in
the test's namespace, so every namespaced object, binding subject and Role lands where
the components run. Its release name is the test's own (``capwatch-<hex>``): the
ClusterRoles and ClusterRoleBindings it applies are cluster-wide, and no two tests (or
engineers' runs) on one API server may share them.

A :class:`Grant` is one verb on one resource (``nodes/status``) in one API group, from one
Role (its namespace) or ClusterRole (every namespace, and cluster scope): the rendered
rules expanded, so that taking one away is precise. Nothing here lists what the chart
should grant: the tests read it from the render and prove it on the server.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.chart.support import CHART, Helm, Manifests
from tests.realkube.access import ApiAccess, ApiError, BoundPod

RBAC = "/apis/rbac.authorization.k8s.io/v1"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
ROLE_KINDS = ("ClusterRole", "Role")
# The chart's app.kubernetes.io/component of each component's objects.
COMPONENTS = {"agent": "node-agent", "controller": "controller", "cleanup": "controller-cleanup"}
CONTROLLER_ON = ("--set", "controller.enabled=true")
AUTHZ_WAIT_S = 30.0


@dataclass(frozen=True, order=True)
class Grant:
    """One verb on one resource, as one rule of one (Cluster)Role allows it."""

    role: str  # "ClusterRole/NAME" or "Role/NAME"
    group: str  # "" is the core group
    resource: str  # "pods", "nodes/status"
    verb: str
    namespace: str | None  # a Role's namespace; None for a ClusterRole

    def __str__(self) -> str:
        group = f".{self.group}" if self.group else ""
        return f"{self.verb} {self.resource}{group} ({self.role})"

    def attributes(self) -> dict[str, str]:
        """SubjectAccessReview resourceAttributes asking for exactly this."""
        resource, _, subresource = self.resource.partition("/")
        return {
            "group": self.group,
            "resource": resource,
            "subresource": subresource,
            "verb": self.verb,
            "namespace": self.namespace or "",
        }


def expand(role: Mapping[str, Any]) -> list[Grant]:
    """Every single grant in a rendered (Cluster)Role's rules."""
    kind, metadata = role["kind"], role["metadata"]
    namespace = metadata.get("namespace") if kind == "Role" else None
    found = []
    for rule in role.get("rules") or []:
        # Names or URLs would make a grant narrower than verb x resource: say so, do not guess.
        assert not rule.get("resourceNames"), f"{kind} {metadata['name']}: resourceNames"
        assert not rule.get("nonResourceURLs"), f"{kind} {metadata['name']}: nonResourceURLs"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    found.append(
                        Grant(f"{kind}/{metadata['name']}", group, resource, verb, namespace)
                    )
    return found


def rules_without(rules: Sequence[Mapping[str, Any]], grant: Grant) -> list[dict[str, Any]]:
    """The rules with one grant taken out: its rule split so that everything else it
    allowed stays allowed, every other rule as it was."""
    kept: list[dict[str, Any]] = []
    for rule in rules:
        groups, resources, verbs = rule["apiGroups"], rule["resources"], rule["verbs"]
        if grant.group not in groups or grant.resource not in resources or grant.verb not in verbs:
            kept.append(dict(rule))
            continue
        if others := [g for g in groups if g != grant.group]:
            kept.append({**rule, "apiGroups": others})
        if others := [r for r in resources if r != grant.resource]:
            kept.append({**rule, "apiGroups": [grant.group], "resources": others})
        if others := [v for v in verbs if v != grant.verb]:
            kept.append(
                {**rule, "apiGroups": [grant.group], "resources": [grant.resource], "verbs": others}
            )
    return kept


def new_release_name() -> str:
    return f"capwatch-{uuid.uuid4().hex[:10]}"


def render(helm: Helm, *, release: str, namespace: str, values: Sequence[str] = ()) -> Manifests:
    """``helm template`` of the chart, controller on, as ``release`` in ``namespace``."""
    done = helm.run(
        "template", release, str(CHART), "--namespace", namespace, *CONTROLLER_ON, *values
    )
    if done.returncode != 0:
        raise AssertionError(f"helm template {' '.join(values)} failed:\n{done.stderr}")
    return Manifests.parse(done.stdout)


# kind: (API path, plural) of what this module applies; cluster-scoped unless namespaced.
_COLLECTIONS = {
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "ClusterRole": (RBAC, "clusterroles"),
    "ClusterRoleBinding": (RBAC, "clusterrolebindings"),
    "Role": (RBAC, "roles"),
    "RoleBinding": (RBAC, "rolebindings"),
    "ValidatingAdmissionPolicy": (ADMISSION, "validatingadmissionpolicies"),
    "ValidatingAdmissionPolicyBinding": (ADMISSION, "validatingadmissionpolicybindings"),
}


def _path(obj: Mapping[str, Any]) -> str:
    """The collection an object is created in."""
    api, plural = _COLLECTIONS[obj["kind"]]
    namespace = obj["metadata"].get("namespace")
    return f"{api}/namespaces/{namespace}/{plural}" if namespace else f"{api}/{plural}"


@dataclass(frozen=True)
class Release:
    """One rendered release of the chart, for one namespace of a real API server."""

    name: str
    namespace: str
    manifests: Manifests

    @classmethod
    def render(
        cls, helm: Helm, namespace: str, *, values: Sequence[str] = (), name: str | None = None
    ) -> Release:
        name = name or new_release_name()
        return cls(name, namespace, render(helm, release=name, namespace=namespace, values=values))

    def objects(self, component: str) -> list[dict[str, Any]]:
        """The component's ServiceAccount, (Cluster)Roles and bindings, as rendered."""
        label = COMPONENTS[component]
        found = [
            obj
            for obj in self.manifests
            if obj["kind"] in RBAC_KINDS
            and obj["metadata"]["labels"]["app.kubernetes.io/component"] == label
        ]
        for obj in found:  # the release namespace is the test's: nothing lands elsewhere
            if obj["kind"] in ("ServiceAccount", "Role", "RoleBinding"):
                assert obj["metadata"]["namespace"] == self.namespace, obj["metadata"]
        return found

    def roles(self, component: str) -> list[dict[str, Any]]:
        return [obj for obj in self.objects(component) if obj["kind"] in ROLE_KINDS]

    def grants(self, component: str) -> list[Grant]:
        """Every single grant of the component's rendered roles, in render order."""
        return [grant for role in self.roles(component) for grant in expand(role)]

    def service_account(self, component: str) -> str:
        """The one account every binding of the component names (in the release namespace)."""
        subjects = {
            (s["kind"], s["name"], s["namespace"])
            for obj in self.objects(component)
            if obj["kind"].endswith("Binding")
            for s in obj["subjects"]
        }
        ((kind, name, namespace),) = subjects
        assert (kind, namespace) == ("ServiceAccount", self.namespace)
        return str(name)

    def user(self, component: str) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account(component)}"

    def container(self, kind: str, name: str) -> dict[str, Any]:
        """A container of the DaemonSet, StatefulSet or Job, as rendered."""
        spec = self.manifests.one(kind)["spec"]["template"]["spec"]
        (container,) = [c for c in spec["containers"] if c["name"] == name]
        found: dict[str, Any] = container
        return found

    def pod_labels(self, kind: str) -> dict[str, str]:
        labels: dict[str, str] = self.manifests.one(kind)["spec"]["template"]["metadata"]["labels"]
        return labels


# --- the API server, as admin -------------------------------------------------------------


def apply(plane: ApiAccess, objects: Iterable[Mapping[str, Any]], *, without: Grant | None = None):
    """Create each object, or replace it if it exists; ``without``: that grant taken out of
    its (Cluster)Role."""
    for obj in objects:
        body = dict(obj)
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        if without is not None and name == without.role:
            body["rules"] = rules_without(obj["rules"], without)
        path = _path(obj)
        try:
            plane.request("POST", path, body)
        except ApiError as err:
            if err.status != 409:
                raise
            current = plane.request("GET", f"{path}/{obj['metadata']['name']}")
            metadata = {
                **body["metadata"],
                "resourceVersion": current["metadata"]["resourceVersion"],
            }
            plane.request(
                "PUT", f"{path}/{obj['metadata']['name']}", {**body, "metadata": metadata}
            )


def remove(plane: ApiAccess, objects: Iterable[Mapping[str, Any]]) -> None:
    """Delete each object (one already gone is no error)."""
    for obj in objects:
        try:
            plane.request("DELETE", f"{_path(obj)}/{obj['metadata']['name']}")
        except ApiError as err:
            if err.status != 404:
                raise


def allowed(plane: ApiAccess, user: str, grant: Grant) -> bool:
    """What the server's authorizer says of ``user`` (a ServiceAccount) asking for ``grant``."""
    namespace = user.split(":")[2]
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{namespace}",
                "system:authenticated",
            ],
            "resourceAttributes": grant.attributes(),
        },
    }
    answer = plane.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
    return bool(answer["status"].get("allowed"))


def wait_authorized(
    plane: ApiAccess,
    user: str,
    *,
    allow: Iterable[Grant],
    deny: Iterable[Grant] = (),
    timeout: float = AUTHZ_WAIT_S,
) -> None:
    """Wait until the authorizer (its RBAC informer lags the writes) allows every grant of
    ``allow`` and denies every one of ``deny`` to ``user``."""
    allow, deny = list(allow), list(deny)
    deadline = time.monotonic() + timeout
    while True:
        wrong = [g for g in allow if not allowed(plane, user, g)]
        wrong += [g for g in deny if allowed(plane, user, g)]
        if not wrong:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"RBAC not in effect for {user} after {timeout:g}s: {wrong}")
        time.sleep(0.1)


def kubeconfig(
    plane: ApiAccess,
    release: Release,
    component: str,
    path: Path,
    *,
    pod: BoundPod | None = None,
) -> Path:
    """A kubeconfig with a TokenRequest token of the component's ServiceAccount (bound to
    ``pod`` when given, as a projected token is) and the release namespace."""
    token = plane.token(release.namespace, release.service_account(component), pod=pod)
    return plane.token_kubeconfig(token, path, namespace=release.namespace)
