"""Nodes in the fake API server: ``/api/v1/nodes``, one Node, and its ``/status`` PATCH.

Served:

- ``GET /api/v1/nodes``: a ``NodeList`` with paging, ``labelSelector`` and
  ``fieldSelector`` (``metadata.name``, ``spec.unschedulable``), and with
  ``watch=true`` a watch with the same event and bookmark semantics as pods
  (kube_lists, kube_watch).
- ``GET /api/v1/nodes/{name}`` (and ``.../status``): the Node, or 404.
- ``PATCH /api/v1/nodes/{name}/status``:
  ``application/strategic-merge-patch+json`` merges ``status.conditions`` by
  ``type`` (kube_patch: replace the given fields of that condition or append
  it; ``{"type": X, "$patch": "delete"}`` removes it) and the rest of
  ``status`` as a JSON merge; ``application/merge-patch+json`` is RFC 7386,
  which replaces the conditions list wholesale. Any other content type is 415
  (JSON patch and apply patches are not modelled); an unknown Node 404; a
  ``metadata.resourceVersion`` in the patch that is not the current one 409
  ``Conflict`` (a precondition, as on the real server). Only ``status`` is
  applied: the status subresource ignores the rest of the object. A patch that
  changes something bumps the resourceVersion and shows on node watches as
  MODIFIED; one that changes nothing (deleting a condition that is not there)
  leaves both alone, as the real storage does, and still answers 200.

Every successful status PATCH is logged (:class:`NodeStatusWrite`) with the
server time, the patch as sent, the User-Agent, and every Lease's state at
that instant, so a test can check who wrote while holding what.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tests.fakes.kube_leases import LeaseState
from tests.fakes.kube_patch import PatchError, json_merge, strategic_merge
from tests.fakes.kube_store import Key, ObjectStore, ResourceVersions, StaleVersionError
from tests.fakes.kube_wire import conflict, not_found, now_rfc3339, status_body, typed

Node = dict[str, Any]
SMP = "application/strategic-merge-patch+json"
MERGE_PATCH = "application/merge-patch+json"
NODE_FIELDS = {
    "metadata.name": lambda node: node["metadata"]["name"],
    "spec.unschedulable": lambda node: str(bool(node["spec"].get("unschedulable"))).lower(),
}
_STATUS_MERGE_KEYS = {("conditions",): "type"}


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
    patch: dict[str, Any]  # the body as sent
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

    def patch_status(self, name: str, patch: dict[str, Any], *, strategic: bool) -> Node:
        """Apply a status patch. KeyError: no such Node; StaleVersionError; PatchError."""
        with self.cond:
            node = self.node(name)
            if node is None:
                raise KeyError(name)
            metadata = patch.get("metadata") or {}
            if not isinstance(metadata, dict):
                raise PatchError(400, "metadata must be a JSON object")
            wanted = metadata.get("resourceVersion")
            if wanted and str(wanted) != node["metadata"]["resourceVersion"]:
                raise StaleVersionError(name)
            if strategic:
                directives = [k for k in patch if k.startswith("$")]
                if directives:
                    raise PatchError(
                        400, f"strategic merge directive {directives[0]!r} is not modelled"
                    )
            if "status" in patch:
                change = patch["status"]
                if change is None:
                    node["status"] = {}
                elif not isinstance(change, dict):
                    raise PatchError(400, f"status must be a JSON object, got {change!r}")
                elif strategic:
                    node["status"] = strategic_merge(node["status"], change, _STATUS_MERGE_KEYS)
                else:
                    node["status"] = json_merge(node["status"], change)
            return self.replace(("", name), node, skip_unchanged=True)

    def log_status_write(self, write: NodeStatusWrite) -> None:
        with self.cond:
            self._writes.append(write)


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

    def _patch_node_status(self, name: str, raw: bytes) -> None:
        handler: Any = self
        fake = handler.fake
        store: NodeStore = fake.nodes
        content_type = handler.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if content_type not in (SMP, MERGE_PATCH):
            message = (
                "the body of the request was in an unknown format - accepted media types"
                f" include: {MERGE_PATCH}, {SMP} (the fake models no others)"
            )
            handler._send_json(415, status_body(415, message))
            return
        try:
            patch = json.loads(raw)
        except ValueError as err:
            handler._send_json(400, status_body(400, f"the patch is not JSON: {err}"))
            return
        if not isinstance(patch, dict):
            handler._send_json(400, status_body(400, "the patch must be a JSON object"))
            return
        # Decided under the lock (the write and its log entry are one instant); answered
        # outside it, so a slow client holds up no one.
        with store.cond:
            try:
                node = store.patch_status(name, patch, strategic=content_type == SMP)
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
