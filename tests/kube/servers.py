"""The API servers the fake's contract tests run against, behind one interface: the fake
(:class:`FakeApiServer`) and a real kube-apiserver
(:class:`~tests.kube.realserver.RealApiServer`).

A contract test gets an :class:`ApiServer` and uses only this: the base URL,
clients that authenticate as the server wants (none for the fake, the admin
client certificate for the real one), and fixtures made as an admin would
make them (Nodes, pods, Leases), each written the way the real server allows:
a pod's phase and IP through its ``status`` subresource, a pod onto a node by
a Binding, a terminating pod by a graceful DELETE, a deleted pod by a DELETE
with no grace period (on a watch: MODIFIED, then DELETED). What only the fake
can do on demand (injected faults, cut-offs, stream controls, the write logs)
is not here: tests that need it take the fake itself (``kube_apiserver``).

Namespaces are fixed names (``NAMESPACES``) that exist on the real server
for the whole run; after each test everything it made there is deleted, so a
test sees only its own objects, as on a fresh fake.
"""

from __future__ import annotations

import abc
import ssl
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import kubernetes.client

from capwatch.kube.access import ClusterAccess
from capwatch.kube.transport import ApiTransport
from tests.fakes.kube_apiserver import FakeKubeApiServer

Obj = dict[str, Any]
NAMESPACES = ("ns", "capwatch", "a", "b", "elsewhere", "other", "default")


def kubelet_ready() -> Obj:
    """The kubelet's Ready condition, stamped now (a new Node's default)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "kubelet is posting ready status",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }


class ApiServer(abc.ABC):
    """One API server under test, and an admin's way of making its fixtures."""

    kind: str  # "fake" or "real"

    def __init__(self) -> None:
        self._clients: list[ApiTransport | kubernetes.client.ApiClient] = []

    @property
    @abc.abstractmethod
    def url(self) -> str: ...

    @property
    def ssl(self) -> ssl.SSLContext | None:
        """The TLS context an admin connects with (None: plain http)."""
        return None

    def client(self, user_agent: str = "test") -> ApiTransport:
        """capwatch's own transport, as an admin, naming itself ``user_agent``; closed
        after the test."""
        transport = ApiTransport(self.access(), user_agent=user_agent)
        self._clients.append(transport)
        return transport

    def library_client(self) -> kubernetes.client.ApiClient:
        """The ``kubernetes`` package's client, as an admin: an independent reader of the
        server's answers (its models must decode them); closed after the test."""
        configuration = kubernetes.client.Configuration(host=self.url)
        configuration.retries = False
        self._configure(configuration)
        client = kubernetes.client.ApiClient(configuration)
        self._clients.append(client)
        return client

    def access(self) -> ClusterAccess:
        """Where the server is and an admin's credentials (none for the fake)."""
        return ClusterAccess(server=self.url)

    @abc.abstractmethod
    def _configure(self, configuration: kubernetes.client.Configuration) -> None:
        """Authentication of the library's client, for servers that want it."""

    def close(self) -> None:
        for client in self._clients:
            client.close()

    # -- fixtures, as an admin makes them -----------------------------------------------

    @abc.abstractmethod
    def resource_version(self) -> str:
        """A resourceVersion no older than every write made so far (a watch from it sees
        only what comes next)."""

    @abc.abstractmethod
    def add_node(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        conditions: list[Obj] | None = None,
    ) -> Obj:
        """Create a Node; ``conditions`` default to the kubelet's Ready (``[]``: none)."""

    @abc.abstractmethod
    def set_node_labels(self, name: str, labels: Mapping[str, str]) -> Obj:
        """Replace the Node's labels wholesale."""

    @abc.abstractmethod
    def delete_node(self, name: str) -> None: ...

    @abc.abstractmethod
    def node(self, name: str) -> Obj | None:
        """The Node as stored (no kind/apiVersion), or None."""

    @abc.abstractmethod
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
        """Create a pod (``node=""``: unscheduled), then set its status: phase, podIP(s)
        (on a watch: ADDED, then MODIFIED)."""

    @abc.abstractmethod
    def set_pod_labels(self, namespace: str, name: str, labels: Mapping[str, str]) -> Obj: ...

    @abc.abstractmethod
    def set_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str]
    ) -> Obj: ...

    @abc.abstractmethod
    def set_pod_ip(self, namespace: str, name: str, pod_ip: str) -> Obj: ...

    @abc.abstractmethod
    def bind_pod(self, namespace: str, name: str, node: str) -> Obj:
        """Schedule an unscheduled pod onto ``node``."""

    @abc.abstractmethod
    def terminate_pod(self, namespace: str, name: str) -> Obj:
        """Delete a pod on a node gracefully: it stays, with a deletionTimestamp."""

    @abc.abstractmethod
    def delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod at once (no grace period)."""

    @abc.abstractmethod
    def add_lease(self, namespace: str, name: str, *, holder: str) -> Obj: ...

    @abc.abstractmethod
    def lease(self, namespace: str, name: str) -> Obj | None:
        """The Lease as stored (no kind/apiVersion), or None."""

    @abc.abstractmethod
    def events(self, namespace: str) -> list[Obj]:
        """The namespace's Events, in name order."""

    def compact(self) -> None:
        """Forget the history up to now: a watch from before the newest write, a continue
        token or an exact list of a version older than it gets 410. Only servers built
        for it (the fake, the real one without a watch cache)."""
        raise NotImplementedError(f"{type(self).__name__} cannot compact on demand")


class FakeApiServer(ApiServer):
    """The fake, through the same interface (its own helpers do the writes)."""

    kind = "fake"

    def __init__(self, fake: FakeKubeApiServer) -> None:
        super().__init__()
        self.fake = fake

    @property
    def url(self) -> str:
        return self.fake.url

    def _configure(self, configuration: kubernetes.client.Configuration) -> None:
        pass  # plain http, no authentication

    def resource_version(self) -> str:
        return str(self.fake.resource_version)

    def add_node(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        conditions: list[Obj] | None = None,
    ) -> Obj:
        return self.fake.add_node(name, labels=labels, conditions=conditions)

    def set_node_labels(self, name: str, labels: Mapping[str, str]) -> Obj:
        return self.fake.update_node_labels(name, labels)

    def delete_node(self, name: str) -> None:
        self.fake.delete_node(name)

    def node(self, name: str) -> Obj | None:
        return self.fake.node(name)

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
        # As on the real server: created Pending (status is not taken on create), then
        # its status written: ADDED, then MODIFIED on a watch.
        self.fake.add_pod(
            namespace,
            name,
            node=node,
            labels=dict(labels or {}),
            annotations=dict(annotations or {}),
            phase="Pending",
        )
        return self.fake.update_pod(namespace, name, phase=phase, pod_ip=pod_ip)

    def set_pod_labels(self, namespace: str, name: str, labels: Mapping[str, str]) -> Obj:
        return self.fake.update_pod(namespace, name, labels=dict(labels))

    def set_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str]) -> Obj:
        return self.fake.update_pod(namespace, name, annotations=dict(annotations))

    def set_pod_ip(self, namespace: str, name: str, pod_ip: str) -> Obj:
        return self.fake.update_pod(namespace, name, pod_ip=pod_ip)

    def bind_pod(self, namespace: str, name: str, node: str) -> Obj:
        return self.fake.update_pod(namespace, name, node=node)

    def terminate_pod(self, namespace: str, name: str) -> Obj:
        return self.fake.update_pod(namespace, name, deletion_timestamp=_stamp(30))

    def delete_pod(self, namespace: str, name: str) -> None:
        # As the real server deletes: the deletionTimestamp moved to now, then the delete.
        self.fake.update_pod(namespace, name, deletion_timestamp=_stamp(0))
        self.fake.delete_pod(namespace, name)

    def add_lease(self, namespace: str, name: str, *, holder: str) -> Obj:
        return self.fake.add_lease(namespace, name, holder=holder)

    def lease(self, namespace: str, name: str) -> Obj | None:
        return self.fake.lease(namespace, name)

    def events(self, namespace: str) -> list[Obj]:
        return sorted(
            (e for e in self.fake.events() if e["metadata"]["namespace"] == namespace),
            key=lambda e: str(e["metadata"]["name"]),
        )

    def compact(self) -> None:
        self.fake.compact()


def untyped(obj: Obj) -> Obj:
    """As the fake's helpers answer: without kind and apiVersion."""
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}


def _stamp(seconds_from_now: int) -> str:
    when = datetime.now(UTC) + timedelta(seconds=seconds_from_now)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")
