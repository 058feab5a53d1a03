"""The Kubernetes objects the controller reads and writes, as JSON: no client library.

A Node's ``GPUPowerCapEnforced`` condition (read from the node watch, written
by a server-side apply of ``nodes/<name>/status``; who else owns it, from the
Node's ``managedFields``; its resourceVersion), a Lease's record, and
the RFC 3339 timestamps both carry. Pure functions: :mod:`capwatch.controller.kube`
sends what they make, discovery reads Nodes with them, and ``--dry-run``
prints them without loading the ``kubernetes`` package.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from capwatch.controller.conditions import CONDITION_TYPE, ConditionStatus, NodeCondition
from capwatch.controller.leasing import LeaseRecord


def rfc3339(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: object) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True, kw_only=True)
class FieldOwner:
    """One of an object's ``managedFields`` entries: who wrote, and how."""

    manager: str
    operation: str  # "Apply" or "Update"


def resource_version(obj: Mapping[str, Any]) -> int | None:
    """An object's resourceVersion as an integer (KEP-5504: a positive decimal integer
    without leading zeros compares as one); None when it is not one."""
    text = (obj.get("metadata") or {}).get("resourceVersion")
    if not isinstance(text, str) or not (text.isascii() and text.isdigit()) or text[0] == "0":
        return None
    return int(text)


def condition_owners(node: Mapping[str, Any], *, manager: str) -> tuple[FieldOwner, ...]:
    """Who owns a field of the Node's ``GPUPowerCapEnforced`` condition, from its
    ``managedFields``; ``manager``'s own applies left out."""
    entry = f"k:{json.dumps({'type': CONDITION_TYPE}, separators=(',', ':'))}"
    owners: list[FieldOwner] = []
    for managed in (node.get("metadata") or {}).get("managedFields") or []:
        if not isinstance(managed, dict):
            continue
        fields = ((managed.get("fieldsV1") or {}).get("f:status") or {}).get("f:conditions")
        owned = isinstance(fields, dict) and any(key != "." for key in (fields.get(entry) or {}))
        owner = FieldOwner(
            manager=str(managed.get("manager") or ""),
            operation=str(managed.get("operation") or ""),
        )
        if owned and owner != FieldOwner(manager=manager, operation="Apply"):
            owners.append(owner)
    return tuple(owners)


def condition_apply(node: str, condition: NodeCondition) -> dict[str, Any]:
    """The server-side apply of ``nodes/<name>/status`` that sets ``condition``: the
    controller's whole intent for the Node (conditions are a map keyed by ``type``, so
    the Node's others, and their owners, are left alone)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node},
        "status": {
            "conditions": [
                {
                    "type": CONDITION_TYPE,
                    "status": condition.status.value,
                    "reason": condition.reason,
                    "message": condition.message,
                    "lastTransitionTime": rfc3339(condition.last_transition_wall),
                    "lastHeartbeatTime": rfc3339(condition.last_heartbeat_wall),
                }
            ]
        },
    }


def node_condition(obj: Mapping[str, Any]) -> NodeCondition | None:
    """A Node's ``GPUPowerCapEnforced`` condition from its JSON, if it has one."""
    for entry in (obj.get("status") or {}).get("conditions") or []:
        if not isinstance(entry, dict) or entry.get("type") != CONDITION_TYPE:
            continue
        try:
            status = ConditionStatus(entry.get("status"))
        except ValueError:
            return None
        transition = parse_time(entry.get("lastTransitionTime")) or 0.0
        return NodeCondition(
            status=status,
            reason=str(entry.get("reason") or ""),
            message=str(entry.get("message") or ""),
            last_transition_wall=transition,
            last_heartbeat_wall=parse_time(entry.get("lastHeartbeatTime")) or transition,
        )
    return None


def lease_record(obj: Mapping[str, Any]) -> LeaseRecord:
    spec = obj.get("spec") or {}
    metadata = obj.get("metadata") or {}
    duration = spec.get("leaseDurationSeconds")
    transitions = spec.get("leaseTransitions")
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        lease_duration_s=duration if isinstance(duration, int) and duration > 0 else 1,
        acquire_time=spec.get("acquireTime") or None,
        renew_time=spec.get("renewTime") or None,
        transitions=transitions if isinstance(transitions, int) else 0,
        resource_version=str(metadata.get("resourceVersion") or ""),
        raw=obj,
    )


def lease_body(name: str, namespace: str, record: LeaseRecord) -> dict[str, Any]:
    """The Lease to create or PUT: the object as read (labels, annotations, owner
    references, finalizers, spec fields such as ``preferredHolder`` kept), with the
    election's fields and the resourceVersion the write is conditional on."""
    body: dict[str, Any] = copy.deepcopy(dict(record.raw)) if record.raw else {}
    body["apiVersion"] = "coordination.k8s.io/v1"
    body["kind"] = "Lease"
    metadata = body.setdefault("metadata", {})
    metadata["name"], metadata["namespace"] = name, namespace
    metadata.pop("resourceVersion", None)
    if record.resource_version:
        metadata["resourceVersion"] = record.resource_version
    body.setdefault("spec", {}).update(
        {
            "holderIdentity": record.holder,
            "leaseDurationSeconds": record.lease_duration_s,
            "acquireTime": record.acquire_time,
            "renewTime": record.renew_time,
            "leaseTransitions": record.transitions,
        }
    )
    return body
