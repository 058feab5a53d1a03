"""The controller's Kubernetes API calls: the one module here that imports the client library.

Requests are made through the client's configuration, authentication and
connection pool (``ApiClient.param_serialize`` and ``call_api``) with JSON
bodies built here and raw JSON answers decoded here: the typed models cost
more than the few fields the controller reads, and a strategic-merge patch of
one condition is clearer as the JSON it is. Calls block, so they run on a
bounded thread pool of their own; each carries its own deadline (connect and
read timeouts) so no call outlives what its caller allowed (the fence of a
condition write, the attempt timeout of a lease renewal). The User-Agent
names this replica, so an API server's audit log (and the fake server's write
log in the tests) can tell who wrote what.

Failures become :class:`~controller.errors.ApiError` (with the HTTP status and
Retry-After), :class:`~controller.errors.Conflict` (409) or
:class:`~controller.errors.NotFound` (404).
"""

from __future__ import annotations

import asyncio
import functools
import http.client
import json
import logging
import os
import secrets
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kubernetes.client
import kubernetes.config
import urllib3
import urllib3.exceptions

from agent.kube.wire import ApiStatusError, retry_after_seconds
from controller.conditions import CONDITION_TYPE, NodeCondition
from controller.errors import FENCING_MARK, ApiError, Conflict, FencedOut, NotFound
from controller.leasing import LeaseRecord
from controller.objects import condition_patch, lease_body, lease_record, rfc3339
from controller.writes.recorder import NodeEvent
from kit.errors import ConfigError

log = logging.getLogger(__name__)

EVENT_NAMESPACE = "default"  # where Node events live (the kubelet's choice too)
COMPONENT = "capwatch-controller"
SMP = "application/strategic-merge-patch+json"
_TRANSIENT = (
    urllib3.exceptions.HTTPError,
    OSError,
    http.client.HTTPException,
    ValueError,
)


def api_client(kubeconfig: str | None, *, identity: str) -> kubernetes.client.ApiClient:
    """In-cluster configuration when ``KUBERNETES_SERVICE_HOST`` is set, else the kubeconfig.

    urllib3's retries are off: every caller owns its retry policy and deadline.
    """
    configuration = kubernetes.client.Configuration()
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    try:
        if in_cluster:
            kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        else:
            kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=configuration
            )
    except Exception as err:  # the loaders raise ConfigException, OSError, YAML errors alike
        option = "in-cluster" if in_cluster else "--kubeconfig"
        raise ConfigError(option, f"cannot load Kubernetes client configuration: {err}") from err
    configuration.retries = False
    configuration.keep_alive = True
    client = kubernetes.client.ApiClient(configuration)
    client.user_agent = f"{COMPONENT}/{identity}"
    return client


class KubeApi:
    """Node status, Events and Leases, asynchronously (blocking calls on a thread pool)."""

    def __init__(
        self,
        client: kubernetes.client.ApiClient,
        *,
        namespace: str,
        identity: str,
        max_threads: int = 16,
    ) -> None:
        self._client = client
        self._namespace = namespace
        self._identity = identity
        self._pool = ThreadPoolExecutor(max_threads, thread_name_prefix="capwatch-kube")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- conditions ----------------------------------------------------------------------

    async def patch_condition(
        self, node: str, condition: NodeCondition, *, deadline_s: float
    ) -> None:
        body = condition_patch(condition)
        await self._call(
            "PATCH",
            f"/api/v1/nodes/{node}/status",
            body=body,
            content_type=SMP,
            deadline_s=deadline_s,
        )

    async def remove_condition(self, node: str, *, deadline_s: float) -> None:
        """Delete ``GPUPowerCapEnforced`` from the Node's conditions (by merge key)."""
        body = {"status": {"conditions": [{"type": CONDITION_TYPE, "$patch": "delete"}]}}
        await self._call(
            "PATCH",
            f"/api/v1/nodes/{node}/status",
            body=body,
            content_type=SMP,
            deadline_s=deadline_s,
        )

    async def list_nodes(self, *, label_selector: str, deadline_s: float) -> list[dict[str, Any]]:
        """Every node matching ``label_selector``, as raw JSON objects (paged)."""
        nodes: list[dict[str, Any]] = []
        token = ""
        while True:
            query = {"labelSelector": label_selector, "limit": "500"}
            if token:
                query["continue"] = token
            page = await self._call("GET", "/api/v1/nodes", query=query, deadline_s=deadline_s)
            nodes += [i for i in page.get("items") or [] if isinstance(i, dict)]
            token = str((page.get("metadata") or {}).get("continue") or "")
            if not token:
                return nodes

    # --- events --------------------------------------------------------------------------

    async def create_event(self, event: NodeEvent, *, deadline_s: float) -> None:
        stamp = rfc3339(event.wall)
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                # As the kubelet names them (the object, then the time in ns), plus a
                # random tail: two transitions in one clock tick must not collide.
                "name": f"{event.node}.{int(event.wall * 1e9):x}{secrets.token_hex(2)}",
                "namespace": EVENT_NAMESPACE,
            },
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Node",
                "name": event.node,
                "uid": event.node,
            },
            "reason": event.reason,
            "message": event.message,
            "type": event.type.value,
            "source": {"component": COMPONENT},
            "reportingComponent": "capwatch.io/controller",
            "reportingInstance": self._identity,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        await self._call(
            "POST", f"/api/v1/namespaces/{EVENT_NAMESPACE}/events", body=body, deadline_s=deadline_s
        )

    # --- leases --------------------------------------------------------------------------

    def _lease_path(self, name: str = "") -> str:
        base = f"/apis/coordination.k8s.io/v1/namespaces/{self._namespace}/leases"
        return f"{base}/{name}" if name else base

    async def get_lease(self, name: str, *, deadline_s: float) -> LeaseRecord | None:
        try:
            return lease_record(
                await self._call("GET", self._lease_path(name), deadline_s=deadline_s)
            )
        except NotFound:
            return None

    async def create_lease(
        self, name: str, record: LeaseRecord, *, deadline_s: float
    ) -> LeaseRecord:
        body = lease_body(name, self._namespace, record)
        return lease_record(
            await self._call("POST", self._lease_path(), body=body, deadline_s=deadline_s)
        )

    async def update_lease(
        self, name: str, record: LeaseRecord, *, deadline_s: float
    ) -> LeaseRecord:
        body = lease_body(name, self._namespace, record)
        return lease_record(
            await self._call("PUT", self._lease_path(name), body=body, deadline_s=deadline_s)
        )

    # --- the one way out -----------------------------------------------------------------

    async def _call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: object = None,
        content_type: str = "application/json",
        deadline_s: float,
    ) -> dict[str, Any]:
        call = functools.partial(
            self._request,
            method,
            path,
            query=query,
            body=body,
            content_type=content_type,
            deadline_s=deadline_s,
        )
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def _request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None,
        body: object,
        content_type: str,
        deadline_s: float,
    ) -> dict[str, Any]:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        try:
            _, url, header_params, serialized, _ = self._client.param_serialize(
                method,
                path,
                query_params=list((query or {}).items()),
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self._client.call_api(
                method,
                url,
                header_params=header_params,
                body=serialized,
                _request_timeout=(deadline_s, deadline_s),
            )
            data = response.read()  # type: ignore[no-untyped-call]
        except kubernetes.client.ApiException as err:
            raise ApiError(
                f"{method} {path}: {err.status} {err.reason}", status=err.status
            ) from err
        except _TRANSIENT as err:
            raise ApiError(f"{method} {path}: {type(err).__name__}: {err}") from err
        status = response.status
        if 200 <= status < 300:
            try:
                decoded = json.loads(data) if data else {}
            except ValueError as err:
                raise ApiError(f"{method} {path}: the answer is not JSON", status=status) from err
            return decoded if isinstance(decoded, dict) else {}
        message = f"{method} {path}: HTTP {status} {_status_message(data)}"
        if status == 404:
            raise NotFound(message, status=status)
        if status == 409:
            raise Conflict(message, status=status)
        if status == 403 and FENCING_MARK in message:
            raise FencedOut(message, status=status)
        raise ApiError(message, status=status, retry_after=retry_after_seconds(response.headers))


class CollectionRequests:
    """LIST and WATCH of one collection (``/api/v1/nodes``, a namespace's pods) as raw
    responses, for :class:`agent.kube.informer.Informer`; a label selector narrows it."""

    def __init__(
        self, client: kubernetes.client.ApiClient, *, path: str, label_selector: str = ""
    ) -> None:
        self._client = client
        self._path = path
        self._selector = label_selector

    def list(self, *, limit: int, continue_token: str, timeout: float) -> urllib3.HTTPResponse:
        query = {"limit": str(limit)}
        if continue_token:
            query["continue"] = continue_token
        return self._raw(query, (timeout, timeout))

    def watch(
        self,
        *,
        resource_version: str,
        timeout_seconds: int,
        connect_timeout: float,
        read_timeout: float,
    ) -> urllib3.HTTPResponse:
        query = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_seconds),
        }
        return self._raw(query, (connect_timeout, read_timeout))

    def _raw(self, query: dict[str, str], timeout: tuple[float, float]) -> urllib3.HTTPResponse:
        if self._selector:
            query["labelSelector"] = self._selector
        try:
            _, url, headers, _, _ = self._client.param_serialize(
                "GET",
                self._path,
                query_params=list(query.items()),
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )
            response = self._client.call_api(
                "GET", url, header_params=headers, _request_timeout=timeout
            )
        except kubernetes.client.ApiException as err:
            raise ApiStatusError(
                status=int(err.status or 0),
                reason=str(err.reason or ""),
                retry_after=retry_after_seconds(err.headers),
            ) from err
        raw: urllib3.HTTPResponse = response.response
        if not 200 <= raw.status < 300:
            try:
                reason = _status_message(raw.data)
            finally:
                raw.release_conn()
            raise ApiStatusError(
                status=raw.status, reason=reason, retry_after=retry_after_seconds(raw.headers)
            )
        return raw


def _status_message(data: bytes | None) -> str:
    """The message of a ``Status`` error body, or a short prefix of whatever came back."""
    try:
        decoded = json.loads(data or b"")
    except ValueError:
        return (data or b"")[:120].decode("utf-8", errors="replace")
    return str(decoded.get("message", "")) if isinstance(decoded, dict) else ""
