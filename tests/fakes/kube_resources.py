"""DRA objects in the fake Kubernetes API server (resource.k8s.io/v1): ResourceClaims
and ResourceSlices, as the agent's claims view reads them.

Written only by tests (there is no write endpoint: the scheduler and the GPU driver
write them on a real cluster), listed and watched by field and label selector through
kube_lists and kube_watch like pods. The field selectors are the real server's: for
slices ``spec.nodeName``, ``spec.driver`` and ``spec.pool.name``; for claims only the
metadata ones every kind has (so the agent cannot select a node's claims, as on a real
server). ``GET /apis/resource.k8s.io/v1`` answers the group version's resource list,
or 404 when the fake is made without it (an API server before 1.34).
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

from tests.fakes.kube_store import ObjectStore, ResourceVersions

Obj = dict[str, Any]
GROUP_VERSION = "resource.k8s.io/v1"

CLAIM_FIELDS = {
    "metadata.name": lambda claim: claim["metadata"]["name"],
    "metadata.namespace": lambda claim: claim["metadata"]["namespace"],
}
TAINT_RULE_FIELDS = {"metadata.name": lambda rule: rule["metadata"]["name"]}
SLICE_FIELDS = {
    "metadata.name": lambda item: item["metadata"]["name"],
    "spec.nodeName": lambda item: item["spec"].get("nodeName", ""),
    "spec.driver": lambda item: item["spec"].get("driver", ""),
    "spec.pool.name": lambda item: item["spec"].get("pool", {}).get("name", ""),
}


def resource_list() -> Obj:
    """The discovery answer for resource.k8s.io/v1 (the kinds capwatch reads)."""
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": GROUP_VERSION,
        "resources": [
            {"name": "resourceclaims", "namespaced": True, "kind": "ResourceClaim",
             "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]},
            {"name": "resourceslices", "namespaced": False, "kind": "ResourceSlice",
             "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]},
        ],
    }  # fmt: skip


class ClaimStore(ObjectStore):
    """ResourceClaims keyed by (namespace, name)."""

    def __init__(self, *, versions: ResourceVersions, history_limit: int = 1000) -> None:
        super().__init__(
            kind="ResourceClaim",
            api_version=GROUP_VERSION,
            versions=versions,
            history_limit=history_limit,
        )

    def put_claim(self, claim: Obj) -> Obj:
        """Create or replace a claim given whole (metadata.namespace and name set; a uid
        is made up when missing). ADDED or MODIFIED, at a new resourceVersion."""
        stored = copy.deepcopy(claim)
        metadata = stored.setdefault("metadata", {})
        key = (metadata["namespace"], metadata["name"])
        with self.cond:
            old = self.get(key)
            if old is None:
                metadata.setdefault("uid", str(uuid.uuid4()))
                return self.create(key, stored)
            metadata["uid"] = old["metadata"]["uid"]
            return self.replace(key, stored)


class SliceStore(ObjectStore):
    """ResourceSlices (cluster-scoped) keyed by ("", name)."""

    def __init__(self, *, versions: ResourceVersions, history_limit: int = 1000) -> None:
        super().__init__(
            kind="ResourceSlice",
            api_version=GROUP_VERSION,
            versions=versions,
            history_limit=history_limit,
        )

    def put_slice(self, item: Obj) -> Obj:
        """Create or replace a slice given whole (metadata.name set)."""
        stored = copy.deepcopy(item)
        metadata = stored.setdefault("metadata", {})
        key = ("", metadata["name"])
        with self.cond:
            old = self.get(key)
            if old is None:
                metadata.setdefault("uid", str(uuid.uuid4()))
                return self.create(key, stored)
            metadata["uid"] = old["metadata"]["uid"]
            return self.replace(key, stored)


class TaintRuleStore(ObjectStore):
    """DeviceTaintRules (cluster-scoped) keyed by ("", name), as the controller writes them."""

    def __init__(self, *, versions: ResourceVersions, history_limit: int = 1000) -> None:
        super().__init__(
            kind="DeviceTaintRule",
            api_version=GROUP_VERSION,
            versions=versions,
            history_limit=history_limit,
        )
