"""A real kube-apiserver behind the contract tests' :class:`~tests.kube.servers.ApiServer`
interface: requests as admin (the client certificate), fixtures written the way the
real server allows them to be written, and what is left deleted after each test."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kubernetes.client

from capwatch.kube.access import ClusterAccess
from tests.kube.servers import NAMESPACES, ApiServer, Obj, kubelet_ready, untyped
from tests.realkube.controlplane import ControlPlane

PAUSE = "registry.k8s.io/pause:3.10"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{}/leases"


class RealApiServer(ApiServer):
    """A real kube-apiserver, as admin (the client certificate)."""

    kind = "real"

    def __init__(self, plane: ControlPlane, *, compacting: bool = False) -> None:
        super().__init__()
        self.plane = plane
        self._compacting = compacting
        context = ssl.create_default_context(cafile=str(plane.ca_path))
        context.load_cert_chain(str(plane.pki.admin.cert), str(plane.pki.admin.key))
        self._ssl = context

    @property
    def url(self) -> str:
        return self.plane.url

    @property
    def ssl(self) -> ssl.SSLContext | None:
        return self._ssl

    def access(self) -> ClusterAccess:
        return ClusterAccess(
            server=self.url,
            ca_pem=self.plane.ca_path.read_bytes(),
            client_cert_pem=self.plane.pki.admin.cert.read_bytes(),
            client_key_pem=self.plane.pki.admin.key.read_bytes(),
        )

    def _configure(self, configuration: kubernetes.client.Configuration) -> None:
        configuration.ssl_ca_cert = str(self.plane.ca_path)
        configuration.cert_file = str(self.plane.pki.admin.cert)
        configuration.key_file = str(self.plane.pki.admin.key)

    def request(
        self,
        method: str,
        path: str,
        body: object = None,
        *,
        content_type: str = "application/json",
        missing_ok: bool = False,
    ) -> Obj | None:
        """One admin request; the JSON answer (None for a 404 when ``missing_ok``)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)  # noqa: S310 - our loopback server
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, context=self._ssl, timeout=30) as response:  # noqa: S310
                text = response.read()
        except urllib.error.HTTPError as err:
            with err:
                detail = err.read().decode(errors="replace")
            if missing_ok and err.code == 404:
                return None
            raise AssertionError(f"{method} {path}: HTTP {err.code}: {detail[:400]}") from None
        return dict(json.loads(text)) if text else {}

    def _must(self, method: str, path: str, body: object = None, **kwargs: Any) -> Obj:
        answer = self.request(method, path, body, **kwargs)
        assert answer is not None
        return answer

    def resource_version(self) -> str:
        # A list without resourceVersion is a consistent read: at the newest revision.
        listed = self._must("GET", "/api/v1/nodes?limit=1")
        return str(listed["metadata"]["resourceVersion"])

    def add_node(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        conditions: list[Obj] | None = None,
    ) -> Obj:
        metadata: Obj = {"name": name}
        if labels:
            metadata["labels"] = dict(labels)
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": metadata,
            "status": {"conditions": [kubelet_ready()] if conditions is None else conditions},
        }
        return untyped(self._must("POST", "/api/v1/nodes", body))

    def set_node_labels(self, name: str, labels: Mapping[str, str]) -> Obj:
        patch = [{"op": "add", "path": "/metadata/labels", "value": dict(labels)}]
        return untyped(self._must("PATCH", f"/api/v1/nodes/{name}", patch, content_type=JSON_PATCH))

    def delete_node(self, name: str) -> None:
        self._must("DELETE", f"/api/v1/nodes/{name}")

    def node(self, name: str) -> Obj | None:
        found = self.request("GET", f"/api/v1/nodes/{name}", missing_ok=True)
        return None if found is None else untyped(found)

    def _pods(self, namespace: str, name: str = "") -> str:
        base = f"/api/v1/namespaces/{namespace}/pods"
        return f"{base}/{name}" if name else base

    def add_pod(
        self,
        namespace: str,
        name: str,
        *,
        node: str = "",
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        pod_ip: str | None = None,
        phase: str = "Running",
    ) -> Obj:
        metadata: Obj = {"name": name}
        if labels:
            metadata["labels"] = dict(labels)
        if annotations:
            metadata["annotations"] = dict(annotations)
        spec: Obj = {"containers": [{"name": "main", "image": PAUSE}]}
        if node:
            spec["nodeName"] = node
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
        self._must("POST", self._pods(namespace), body)
        status: Obj = {"phase": phase}
        if pod_ip:
            status.update(podIP=pod_ip, podIPs=[{"ip": pod_ip}])
        return self._pod_status(namespace, name, status)

    def _pod_status(self, namespace: str, name: str, status: Obj) -> Obj:
        path = self._pods(namespace, name) + "/status"
        return untyped(self._must("PATCH", path, {"status": status}, content_type=MERGE))

    def _pod_metadata(self, namespace: str, name: str, field: str, value: Mapping[str, str]) -> Obj:
        patch = [{"op": "add", "path": f"/metadata/{field}", "value": dict(value)}]
        path = self._pods(namespace, name)
        return untyped(self._must("PATCH", path, patch, content_type=JSON_PATCH))

    def set_pod_labels(self, namespace: str, name: str, labels: Mapping[str, str]) -> Obj:
        return self._pod_metadata(namespace, name, "labels", labels)

    def set_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str]) -> Obj:
        return self._pod_metadata(namespace, name, "annotations", annotations)

    def set_pod_ip(self, namespace: str, name: str, pod_ip: str) -> Obj:
        return self._pod_status(namespace, name, {"podIP": pod_ip, "podIPs": [{"ip": pod_ip}]})

    def bind_pod(self, namespace: str, name: str, node: str) -> Obj:
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        self._must("POST", self._pods(namespace, name) + "/binding", binding)
        return untyped(self._must("GET", self._pods(namespace, name)))

    def terminate_pod(self, namespace: str, name: str) -> Obj:
        return untyped(self._must("DELETE", self._pods(namespace, name)))

    def delete_pod(self, namespace: str, name: str) -> None:
        self._must("DELETE", self._pods(namespace, name) + "?gracePeriodSeconds=0")

    def add_lease(self, namespace: str, name: str, *, holder: str) -> Obj:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name},
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": 15,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
        return untyped(self._must("POST", LEASES.format(namespace), body))

    def lease(self, namespace: str, name: str) -> Obj | None:
        found = self.request("GET", f"{LEASES.format(namespace)}/{name}", missing_ok=True)
        return None if found is None else untyped(found)

    def events(self, namespace: str) -> list[Obj]:
        listed = self._must("GET", f"/api/v1/namespaces/{namespace}/events")
        return list(listed["items"])

    def compact(self) -> None:
        if not self._compacting:
            super().compact()
        # One more revision, then compact up to it: every version before it is gone,
        # as the fake forgets everything up to its current version.
        path = "/api/v1/namespaces/default/configmaps"
        self._must("POST", path, {"metadata": {"generateName": "compaction-"}})
        assert self.plane.ports is not None
        revision = _etcd(self.plane.ports.etcd_client, "/v3/kv/range", {"key": "Lw=="})
        _etcd(
            self.plane.ports.etcd_client,
            "/v3/kv/compaction",
            {"revision": revision["header"]["revision"], "physical": True},
        )

    def clean(self) -> None:
        """Delete everything a test made: Nodes, and the pods, Leases and Events of each
        of ``NAMESPACES`` that has any (a list of each kind first, so that a test pays
        for what it made, not for every namespace), and the compaction ConfigMaps."""
        if self._listed("/api/v1/nodes?limit=1"):
            self._must("DELETE", "/api/v1/nodes")
        kinds = {
            "/api/v1/pods": "/api/v1/namespaces/{}/pods?gracePeriodSeconds=0",
            "/api/v1/events": "/api/v1/namespaces/{}/events",
            "/apis/coordination.k8s.io/v1/leases": LEASES,
        }
        for listing, collection in kinds.items():
            for namespace in sorted(self._namespaces(listing) & set(NAMESPACES)):
                self._must("DELETE", collection.format(namespace))
        if self._compacting:
            query = urllib.parse.urlencode({"fieldSelector": "metadata.name!=kube-root-ca.crt"})
            self._must("DELETE", f"/api/v1/namespaces/default/configmaps?{query}")

    def _listed(self, path: str) -> list[Obj]:
        return list(self._must("GET", path)["items"])

    def _namespaces(self, path: str) -> set[str]:
        return {str(item["metadata"]["namespace"]) for item in self._listed(path)}


def prepare(plane: ControlPlane) -> None:
    """Create the namespaces contract tests use (once per control plane)."""
    server = RealApiServer(plane)
    for namespace in NAMESPACES:
        if server.request("GET", f"/api/v1/namespaces/{namespace}", missing_ok=True) is None:
            server._must("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})


def _etcd(port: int, path: str, body: Obj) -> Obj:
    request = urllib.request.Request(  # etcd's gRPC gateway on loopback
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
        return dict(json.loads(response.read()))
