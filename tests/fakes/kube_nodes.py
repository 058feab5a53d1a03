"""Nodes in the fake API server: ``/api/v1/nodes``, one Node, and its ``/status`` PATCH.

Served:

- ``GET /api/v1/nodes``: a ``NodeList`` with paging, ``labelSelector`` and
  ``fieldSelector`` (``metadata.name``, ``spec.unschedulable``), and with
  ``watch=true`` a watch with the same event and bookmark semantics as pods
  (kube_lists, kube_watch).
- ``GET /api/v1/nodes/{name}`` (and ``.../status``): the Node, or 404.
- ``PATCH /api/v1/nodes/{name}/status``:
  ``application/strategic-merge-patch+json`` merges ``status.conditions`` and
  ``status.addresses`` by ``type`` (kube_patch: replace the given fields of
  that element or add it, ordered as the real server orders the result: an
  element new to the list comes first; ``{"type": X, "$patch": "delete"}``
  removes it) and the rest of ``status`` as a JSON merge;
  ``application/merge-patch+json`` is RFC 7386, which replaces the
  conditions list wholesale; ``application/json-patch+json`` is RFC 6902 over
  the whole Node; ``application/apply-patch+yaml`` (server-side apply, JSON
  body) needs ``fieldManager`` (400 without, as on the real server) and a
  body naming the Node (``apiVersion``, ``kind``, ``metadata.name``), and
  merges ``status.conditions`` by ``type`` as the strategic merge does: what
  the real server does for an apply that sets one condition. Field ownership
  is not modelled (no ``managedFields``, so no apply is refused for a field
  another manager owns: tests/realkube covers that on the real server). Any
  other content type is 415; an unknown Node 404; a ``metadata.resourceVersion`` in the patch
  that is not the current one 409 ``Conflict`` (a precondition, as on the
  real server); a status or conditions value of the wrong type, or a
  condition time that is not RFC 3339, 422. Condition times are stored as the
  real server stores a ``metav1.Time``: whole seconds, UTC. Only ``status``
  and the metadata's labels and annotations are applied (the real Node status
  strategy keeps the spec and takes those). A patch
  that changes something bumps the resourceVersion and shows on node watches
  as MODIFIED; one that changes nothing (deleting a condition that is not
  there) leaves both alone, as the real storage does, and still answers 200.

Every successful status PATCH is logged (:class:`NodeStatusWrite`) with the
server time, the patch as sent, the User-Agent, and every Lease's state at
that instant, so a test can check who wrote while holding what.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tests.fakes.kube_leases import LeaseState
from tests.fakes.kube_patch import PatchError, json_merge, json_patch, strategic_merge
from tests.fakes.kube_store import Key, ObjectStore, ResourceVersions, StaleVersionError
from tests.fakes.kube_wire import (
    conflict,
    normalize_time,
    not_found,
    now_rfc3339,
    status_body,
    typed,
)

Node = dict[str, Any]
SMP = "application/strategic-merge-patch+json"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"
PATCH_TYPES = (SMP, MERGE_PATCH, JSON_PATCH, APPLY)
NODE_FIELDS = {
    "metadata.name": lambda node: node["metadata"]["name"],
    "spec.unschedulable": lambda node: str(bool(node["spec"].get("unschedulable"))).lower(),
}
_STATUS_MERGE_KEYS = {("conditions",): "type", ("addresses",): "type"}
_CONDITION_TIMES = ("lastHeartbeatTime", "lastTransitionTime")
# What the real Node status strategy takes from a status write beside the status.
_STATUS_METADATA = ("labels", "annotations")


def ready_condition() -> dict[str, str]:
    """The kubelet's Ready condition, as a new node's default."""
    now = now_rfc3339()
    return {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "kubelet is posting ready status",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }


@dataclass(frozen=True, kw_only=True)
class NodeStatusWrite:
    """One successful ``PATCH /api/v1/nodes/{node}/status``."""

    at: float  # server time.monotonic() when it was applied
    node: str
    content_type: str
    patch: Any  # the body as sent (a map; a list for a JSON patch)
    user_agent: str
    resource_version: str  # the Node's after the write
    leases: Mapping[Key, LeaseState]  # every Lease at that instant, by (namespace, name)

    def lease(self, namespace: str, name: str) -> LeaseState | None:
        return self.leases.get((namespace, name))


class NodeStore(ObjectStore):
    """Nodes keyed by ("", name), and the log of their status writes."""

    def __init__(self, *, versions: ResourceVersions, history_limit: int = 1000) -> None:
        super().__init__(
            kind="Node", api_version="v1", versions=versions, history_limit=history_limit
        )
        self._writes: list[NodeStatusWrite] = []

    def add_node(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        conditions: list[dict[str, Any]] | None = None,
        uid: str | None = None,
    ) -> Node:
        """Create a Node (ADDED); ``conditions`` default to a Ready one (``[]`` for none)."""
        metadata: dict[str, Any] = {
            "name": name,
            "uid": uid or str(uuid.uuid4()),
            "creationTimestamp": now_rfc3339(),
        }
        if labels:
            metadata["labels"] = dict(labels)
        node: Node = {
            "metadata": metadata,
            "spec": {},
            "status": {
                "conditions": [ready_condition()] if conditions is None else list(conditions)
            },
        }
        return self.create(("", name), node)

    def update_node_labels(self, name: str, labels: Mapping[str, str]) -> Node:
        """Replace the Node's labels wholesale (MODIFIED). KeyError if it does not exist."""
        with self.cond:
            node = self.node(name)
            if node is None:
                raise KeyError(f"no node {name}")
            node["metadata"].pop("labels", None)
            if labels:
                node["metadata"]["labels"] = dict(labels)
            return self.replace(("", name), node)

    def delete_node(self, name: str) -> None:
        self.delete(("", name))

    def node(self, name: str) -> Node | None:
        return self.get(("", name))

    def status_writes(self, node: str | None = None) -> list[NodeStatusWrite]:
        with self.cond:
            return [w for w in self._writes if node in (None, w.node)]

    def patch_status(self, name: str, patch: Any, *, content_type: str) -> Node:
        """Apply a status patch. KeyError: no such Node; StaleVersionError; PatchError."""
        with self.cond:
            node = self.node(name)
            if node is None:
                raise KeyError(name)
            if content_type == JSON_PATCH:
                self._apply_json_patch(node, patch)
                return self.replace(("", name), node, skip_unchanged=True)
            if content_type == APPLY:
                _check_apply(name, patch)
                patch = _appending(node, patch)
            self._apply_merge(node, patch, strategic=content_type in (SMP, APPLY))
            return self.replace(("", name), node, skip_unchanged=True)

    @staticmethod
    def _apply_merge(node: Node, patch: Any, *, strategic: bool) -> None:
        """A strategic merge or JSON merge patch: its metadata's labels and annotations,
        its status. StaleVersionError; PatchError."""
        if not isinstance(patch, dict):
            raise PatchError(400, "json: cannot unmarshal array into Go value of type map")
        metadata = patch.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise PatchError(422, "metadata must be a JSON object")
        wanted = metadata.get("resourceVersion")
        if wanted and str(wanted) != node["metadata"]["resourceVersion"]:
            raise StaleVersionError(node["metadata"]["name"])
        directives = [k for k in patch if k.startswith("$")]
        if strategic and directives:
            raise PatchError(400, f"strategic merge directive {directives[0]!r} is not modelled")
        for field in _STATUS_METADATA:
            if field in metadata:
                merged = json_merge(node["metadata"].get(field), metadata[field])
                _set_map(node["metadata"], field, merged)
        change = patch.get("status", {})
        if change is None:
            node["status"] = {}
        elif not isinstance(change, dict):
            raise PatchError(422, f"status: cannot restore struct from {change!r}")
        elif strategic:
            node["status"] = strategic_merge(node["status"], change, _STATUS_MERGE_KEYS)
        else:
            node["status"] = json_merge(node["status"], change)
        node["status"] = _checked_status(node["status"])

    def _apply_json_patch(self, node: Node, patch: Any) -> None:
        patched = json_patch(typed(node, self.kind, self.api_version), patch)
        if not isinstance(patched, dict) or not isinstance(patched.get("metadata"), dict):
            raise PatchError(422, "the patched Node is not a JSON object")
        node["status"] = _checked_status(patched.get("status"))
        for field in _STATUS_METADATA:
            _set_map(node["metadata"], field, patched["metadata"].get(field))

    def log_status_write(self, write: NodeStatusWrite) -> None:
        with self.cond:
            self._writes.append(write)


def _appending(node: Node, patch: dict[str, Any]) -> dict[str, Any]:
    """An apply puts a condition new to the Node after the others (the strategic merge
    puts it first): the conditions the apply adds are appended here, and only those it
    changes in place are left to the merge."""
    wanted = (patch.get("status") or {}).get("conditions")
    if not isinstance(wanted, list):
        return patch
    conditions = node["status"].setdefault("conditions", [])
    have = {c.get("type") for c in conditions if isinstance(c, dict)}
    conditions.extend(
        copy.deepcopy(c) for c in wanted if isinstance(c, dict) and c.get("type") not in have
    )
    return patch


def _check_apply(name: str, patch: Any) -> None:
    """An apply body must say what it is and name the Node it is sent to."""
    if not isinstance(patch, dict):
        raise PatchError(400, "the apply body is not an object")
    if patch.get("apiVersion") != "v1" or patch.get("kind") != "Node":
        raise PatchError(400, "apiVersion and kind must be v1 Node")
    if (patch.get("metadata") or {}).get("name") != name:
        raise PatchError(400, f"the apply body does not name the Node {name!r}")


class NodesEndpoint:
    """Mixed into the handler, which supplies ``fake``, ``headers``, ``_send_json`` and
    ``_collection``."""

    def _get_node(self, name: str) -> None:
        handler: Any = self
        store: NodeStore = handler.fake.nodes
        node = store.node(name)
        if node is None:
            handler._send_json(404, not_found("nodes", "", name))
        else:
            handler._send_json(200, typed(node, store.kind, store.api_version))

    def _patch_node_status(self, name: str, raw: bytes, query: Mapping[str, str]) -> None:
        handler: Any = self
        fake = handler.fake
        store: NodeStore = fake.nodes
        content_type = handler.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if content_type not in PATCH_TYPES:
            message = (
                "the body of the request was in an unknown format - accepted media types"
                f" include: {', '.join(PATCH_TYPES)}"
            )
            handler._send_json(415, status_body(415, message))
            return
        if content_type == APPLY and not query.get("fieldManager"):
            message = "PATCH, application/apply-patch+yaml requests require fieldManager"
            handler._send_json(400, status_body(400, message))
            return
        try:
            patch = json.loads(raw)
        except ValueError as err:
            handler._send_json(400, status_body(400, f"the patch is not JSON: {err}"))
            return
        # Decided under the lock (the write and its log entry are one instant); answered
        # outside it, so a slow client holds up no one.
        with store.cond:
            try:
                node = store.patch_status(name, patch, content_type=content_type)
            except KeyError:
                code, body = 404, not_found("nodes", "", name)
            except StaleVersionError:
                code, body = 409, conflict("nodes", "", name)
            except PatchError as err:
                code, body = err.code, status_body(err.code, str(err))
            else:
                store.log_status_write(
                    NodeStatusWrite(
                        at=time.monotonic(),
                        node=name,
                        content_type=content_type,
                        patch=patch,
                        user_agent=handler.headers.get("User-Agent", ""),
                        resource_version=node["metadata"]["resourceVersion"],
                        leases=fake.leases.states(),
                    )
                )
                code, body = 200, typed(node, store.kind, store.api_version)
        handler._send_json(code, body)


def _set_map(metadata: dict[str, Any], field: str, value: Any) -> None:
    """metadata[field] = value, a map of strings (422 otherwise), left out when empty."""
    if value is not None and (
        not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values())
    ):
        raise PatchError(422, f"metadata.{field}: cannot restore map of strings from {value!r}")
    metadata.pop(field, None)
    if value:
        metadata[field] = value


def _checked_status(status: Any) -> dict[str, Any]:
    """A Node status as the real server would store it: maps and lists where the schema
    has them (PatchError 422 otherwise), condition times as ``metav1.Time``."""
    if status is None:
        return {}
    if not isinstance(status, dict):
        raise PatchError(422, f"status: cannot restore struct from {status!r}")
    conditions = status.get("conditions")
    if conditions is None:
        return status
    if not isinstance(conditions, list) or not all(isinstance(c, dict) for c in conditions):
        raise PatchError(422, f"status.conditions: cannot restore slice from {conditions!r}")
    for condition in conditions:
        for field in _CONDITION_TIMES:
            if condition.get(field) is None:
                condition.pop(field, None)
                continue
            try:
                condition[field] = normalize_time(condition[field])
            except ValueError as err:
                raise PatchError(422, f"status.conditions.{field}: {err}") from None
    return status
