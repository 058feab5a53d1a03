"""Pods in the fake Kubernetes API server: their shape and the test's writes.

A pod carries what capwatch's readers use: ``metadata`` (name, namespace,
uid, resourceVersion, creationTimestamp, annotations, labels when it has
any, deletionTimestamp once it is terminating), ``spec.nodeName`` and
``status`` (phase, and podIP/podIPs once it has an address), plus the
defaults the real server fills in that field selectors read
(``spec.schedulerName``, ``spec.restartPolicy``, ``status.qosClass``). Pods
are written only by tests (there is no pod write endpoint); lists and watches
of them, by field and label selector, are served by kube_lists and
kube_watch. The field selectors are the real server's for pods.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from tests.fakes.kube_store import ObjectStore, ResourceVersions

Pod = dict[str, Any]

# Fields the fake can select pods on, as the real server names them.
POD_FIELDS = {
    "spec.nodeName": lambda pod: pod["spec"].get("nodeName", ""),
    "spec.restartPolicy": lambda pod: pod["spec"].get("restartPolicy", ""),
    "spec.schedulerName": lambda pod: pod["spec"].get("schedulerName", ""),
    "spec.serviceAccountName": lambda pod: pod["spec"].get("serviceAccountName", ""),
    "spec.hostNetwork": lambda pod: str(bool(pod["spec"].get("hostNetwork"))).lower(),
    "metadata.name": lambda pod: pod["metadata"]["name"],
    "metadata.namespace": lambda pod: pod["metadata"]["namespace"],
    "status.phase": lambda pod: pod["status"].get("phase", ""),
    "status.podIP": lambda pod: pod["status"].get("podIP", ""),
    "status.podIPs": lambda pod: ",".join(ip["ip"] for ip in pod["status"].get("podIPs", [])),
    "status.nominatedNodeName": lambda pod: pod["status"].get("nominatedNodeName", ""),
}

DEFAULT_CREATED = "2025-01-01T00:00:00Z"


class PodStore(ObjectStore):
    """Pods keyed by (namespace, name)."""

    def __init__(self, *, versions: ResourceVersions | None = None, history_limit: int = 1000):
        super().__init__(
            kind="Pod",
            api_version="v1",
            versions=versions or ResourceVersions(),
            history_limit=history_limit,
        )

    def add_pod(
        self,
        namespace: str,
        name: str,
        *,
        node: str,
        annotations: dict[str, str] | None = None,
        phase: str = "Running",
        uid: str | None = None,
        labels: dict[str, str] | None = None,
        pod_ip: str | None = None,
        created: str | None = None,
        deletion_timestamp: str | None = None,
        claims: Sequence[str] = (),
    ) -> Pod:
        """Create a pod (ADDED). ``node=""`` leaves it unscheduled (no nodeName);
        ``claims`` are ResourceClaims its spec names (``resourceClaimName``)."""
        pod: Pod = {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": uid or str(uuid.uuid4()),
                "creationTimestamp": created or DEFAULT_CREATED,
                "annotations": dict(annotations or {}),
            },
            "spec": {
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                "restartPolicy": "Always",
                "schedulerName": "default-scheduler",
            },
            "status": {"phase": phase, "qosClass": "BestEffort"},
        }
        if claims:
            pod["spec"]["resourceClaims"] = [
                {"name": f"claim-{i}", "resourceClaimName": claim} for i, claim in enumerate(claims)
            ]
        _set(pod, node=node, labels=labels, pod_ip=pod_ip, deletion_timestamp=deletion_timestamp)
        return self.create((namespace, name), pod)

    def update_pod(
        self,
        namespace: str,
        name: str,
        *,
        annotations: dict[str, str] | None = None,
        node: str | None = None,
        phase: str | None = None,
        labels: dict[str, str] | None = None,
        pod_ip: str | None = None,
        deletion_timestamp: str | None = None,
    ) -> Pod:
        """Replace the given fields and bump the rv (MODIFIED, even if nothing changed).

        None leaves a field as it is; annotations and labels are replaced
        wholesale; ``""`` removes nodeName, podIP or deletionTimestamp.
        """
        with self.cond:
            pod = self.get((namespace, name))
            if pod is None:
                raise KeyError(f"no pod {namespace}/{name}")
            if annotations is not None:
                pod["metadata"]["annotations"] = dict(annotations)
            if phase is not None:
                pod["status"]["phase"] = phase
            _set(
                pod, node=node, labels=labels, pod_ip=pod_ip, deletion_timestamp=deletion_timestamp
            )
            return self.replace((namespace, name), pod)

    def delete_pod(self, namespace: str, name: str) -> None:
        self.delete((namespace, name))


def _set(
    pod: Pod,
    *,
    node: str | None,
    labels: dict[str, str] | None,
    pod_ip: str | None,
    deletion_timestamp: str | None,
) -> None:
    metadata, spec, status = pod["metadata"], pod["spec"], pod["status"]
    if labels is not None:
        # Like the real server's JSON, an empty map is left out.
        metadata.pop("labels", None)
        if labels:
            metadata["labels"] = dict(labels)
    if node is not None:
        spec.pop("nodeName", None)
        if node:
            spec["nodeName"] = node
    if pod_ip is not None:
        status.pop("podIP", None)
        status.pop("podIPs", None)
        if pod_ip:
            status["podIP"] = pod_ip
            status["podIPs"] = [{"ip": pod_ip}]
    if deletion_timestamp is not None:
        metadata.pop("deletionTimestamp", None)
        metadata.pop("deletionGracePeriodSeconds", None)
        if deletion_timestamp:
            metadata["deletionTimestamp"] = deletion_timestamp
            metadata["deletionGracePeriodSeconds"] = 30
