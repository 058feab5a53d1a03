"""The agent's own Kubernetes requests: the pod LIST and WATCH behind the pod view (this
node's pods, through :class:`~capwatch.kube.client.CollectionRequests`; the list+watch
mechanics are :mod:`capwatch.kube.informer`'s, the decoding
:func:`capwatch.agent.kube.pod_wire.pod_info`'s), and the sink that posts
:mod:`capwatch.agent.podevents`' Events.
"""

from __future__ import annotations

import json

import urllib3

from capwatch.agent.podevents import EventSinkError, PodEvent, event_body
from capwatch.kit.clock import Clock
from capwatch.kube.client import CollectionRequests, describe
from capwatch.kube.transport import ApiTransport
from capwatch.kube.wire import TRANSIENT, WRITE_TIMEOUT_S, status_message


class KubernetesEventSink:
    """Creates pod Events (core/v1) for :class:`capwatch.agent.podevents.PodEvents`."""

    def __init__(
        self,
        *,
        transport: ApiTransport,
        node_name: str,
        clock: Clock,
        release: str = "capwatch",
        request_timeout: float = WRITE_TIMEOUT_S,
    ) -> None:
        self._transport = transport
        self._node = node_name
        self._release = release
        self._clock = clock
        self._timeout = request_timeout

    def post(self, event: PodEvent) -> None:
        body = event_body(
            event, node_name=self._node, wall=self._clock.wall(), release=self._release
        )
        where = f"pod {event.pod.namespace}/{event.pod.name}"
        try:
            response = self._transport.request(
                "POST",
                f"/api/v1/namespaces/{event.pod.namespace}/events",
                body=json.dumps(body).encode(),
                timeout=(self._timeout, self._timeout),
            )
            status = response.status
            # Read to the end before the connection goes back to the pool: left unread,
            # the body would be the next request's status line (or cost a new connection).
            data = response.data
            response.release_conn()
        except TRANSIENT as err:
            raise EventSinkError(f"cannot create an event for {where}: {describe(err)}") from err
        if not 200 <= status < 300:
            raise EventSinkError(
                f"cannot create an event for {where}: HTTP {status} {status_message(data)}"
            )


class KubernetesPodRequests:
    """The pod LIST and WATCH, as raw responses (a
    :class:`~capwatch.kube.informer.ListWatchRequests`): cluster-wide, or in one namespace,
    this node's pods only (a field selector on ``spec.nodeName``)."""

    def __init__(self, transport: ApiTransport, *, node_name: str, namespace: str | None) -> None:
        # None: every namespace (a ClusterRole); a name: that one (a namespaced Role).
        path = "/api/v1/pods" if namespace is None else f"/api/v1/namespaces/{namespace}/pods"
        self._requests = CollectionRequests(
            transport, path=path, field_selector=f"spec.nodeName={node_name}"
        )

    def list(self, *, limit: int, continue_token: str, timeout: float) -> urllib3.HTTPResponse:
        return self._requests.list(limit=limit, continue_token=continue_token, timeout=timeout)

    def watch(
        self,
        *,
        resource_version: str,
        timeout_seconds: int,
        connect_timeout: float,
        read_timeout: float,
    ) -> urllib3.HTTPResponse:
        return self._requests.watch(
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
        )
