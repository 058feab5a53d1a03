"""Whether a DaemonSet still runs on a node, decided over the objects' JSON.

:class:`capwatch.agent.kube.departure.KubeDepartureCheck` asks it at shutdown; the rules
are the DaemonSet controller's for a pod that should continue running on its
node: the DaemonSet exists and is not being deleted, the node exists and is
not being deleted, the template's nodeSelector and required node affinity
match the node, and every NoExecute taint on the node is tolerated. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from capwatch.agent.departure import Departure

# The DaemonSet controller adds these tolerations to every pod it makes, so a
# node's own not-ready or unreachable taints never make it drop a DaemonSet pod.
_IMPLIED_TOLERATIONS = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
)


def judge(
    *,
    daemonset: Mapping[str, Any] | None,
    name: str,
    node: Mapping[str, Any] | None,
    node_name: str,
) -> Departure:
    """The answer from the agent's DaemonSet (None: not found) and its node (None: not
    found). ``name`` is the DaemonSet's namespace/name."""
    if daemonset is None:
        return Departure(leaving=True, reason=f"DaemonSet {name} is deleted")
    if _meta(daemonset).get("deletionTimestamp"):
        return Departure(leaving=True, reason=f"DaemonSet {name} is being deleted")
    if node is None:
        return Departure(leaving=True, reason=f"node {node_name} is deleted")
    if _meta(node).get("deletionTimestamp"):
        return Departure(leaving=True, reason=f"node {node_name} is being deleted")
    spec = _dict(_dict(_dict(daemonset.get("spec")).get("template")).get("spec"))
    why_not = not_selected(spec, node)
    if why_not is not None:
        return Departure(
            leaving=True, reason=f"DaemonSet {name} no longer runs on node {node_name}: {why_not}"
        )
    return Departure(
        leaving=False,
        reason=f"DaemonSet {name} still runs on node {node_name}: its next pod adopts the caps",
    )


def not_selected(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> str | None:
    """Why a DaemonSet pod template no longer runs on ``node`` (None: it does), as the
    DaemonSet controller decides whether a pod should continue running there."""
    labels = _strings(_meta(node).get("labels"))
    for key, value in _strings(pod_spec.get("nodeSelector")).items():
        if labels.get(key) != value:
            return f"nodeSelector {key}={value}"
    affinity = _dict(_dict(pod_spec.get("affinity")).get("nodeAffinity"))
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if isinstance(required, dict):
        terms = [t for t in required.get("nodeSelectorTerms") or [] if isinstance(t, dict)]
        name = str(_meta(node).get("name") or "")
        if not any(_term_matches(term, labels, name) for term in terms):
            return "required node affinity"
    tolerations = [t for t in pod_spec.get("tolerations") or [] if isinstance(t, dict)]
    tolerations += _IMPLIED_TOLERATIONS
    for taint in _dict(node.get("spec")).get("taints") or []:
        if not isinstance(taint, dict) or taint.get("effect") != "NoExecute":
            continue
        if not any(_tolerates(toleration, taint) for toleration in tolerations):
            key, value = taint.get("key", ""), taint.get("value", "")
            return f"taint {key}{'=' + value if value else ''}:NoExecute not tolerated"
    return None


def _term_matches(term: Mapping[str, Any], labels: Mapping[str, str], name: str) -> bool:
    """A node selector term: every expression holds (an empty term matches nothing)."""
    expressions = [e for e in term.get("matchExpressions") or [] if isinstance(e, dict)]
    fields = [f for f in term.get("matchFields") or [] if isinstance(f, dict)]
    if not expressions and not fields:
        return False
    by_field = {"metadata.name": name}
    return all(_holds(e, labels) for e in expressions) and all(_holds(f, by_field) for f in fields)


def _holds(requirement: Mapping[str, Any], values: Mapping[str, str]) -> bool:
    key = str(requirement.get("key") or "")
    operator = requirement.get("operator")
    wanted = [str(v) for v in requirement.get("values") or []]
    present = key in values
    value = values.get(key, "")
    if operator == "In":
        return present and value in wanted
    if operator == "NotIn":
        return not present or value not in wanted
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(wanted) == 1:
        try:
            have, bound = int(value), int(wanted[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False  # an operator the API server would have refused


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if toleration.get("operator") == "Exists":
        return not key or key == taint.get("key")
    return key == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")


def controller_daemonset(pod: Mapping[str, Any]) -> str | None:
    """The name of the DaemonSet that controls ``pod`` (None: no DaemonSet does)."""
    references: Sequence[Any] = _meta(pod).get("ownerReferences") or []
    for reference in references:
        if (
            isinstance(reference, dict)
            and reference.get("controller")
            and reference.get("kind") == "DaemonSet"
        ):
            return str(reference.get("name") or "") or None
    return None


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    return _dict(obj.get("metadata"))


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _strings(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in _dict(value).items()}
