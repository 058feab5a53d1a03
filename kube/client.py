"""Requests to the API server that every capwatch client makes: the transport to this
process's cluster (:func:`api_transport`), whether a group version is served, LIST and
WATCH of a collection for :class:`~capwatch.kube.informer.Informer`, and GETs of single
objects, all as raw urllib3 responses or decoded JSON through
:class:`~capwatch.kube.transport.ApiTransport`. An HTTP error status leaves as
:class:`~capwatch.kube.wire.ApiStatusError`; anything short of an answer as one line
(:func:`describe`).
"""

from __future__ import annotations

import logging

import urllib3

from capwatch.kit.errors import CapwatchError
from capwatch.kube.access import from_environment
from capwatch.kube.transport import DEFAULT_CONNECTIONS, ApiTransport
from capwatch.kube.wire import (
    TRANSIENT,
    ApiStatusError,
    read_json,
    retry_after_seconds,
    status_message,
)

logger = logging.getLogger(__name__)


def api_transport(
    kubeconfig: str | None, *, user_agent: str, connections: int = DEFAULT_CONNECTIONS
) -> ApiTransport:
    """The transport to this process's cluster (:func:`capwatch.kube.access.from_environment`:
    in-cluster when ``KUBERNETES_SERVICE_HOST`` is set, else the kubeconfig), naming
    itself ``user_agent``, keeping up to ``connections`` open (what its users may have
    in flight at once). A missing or malformed configuration is a ConfigError."""
    return ApiTransport(from_environment(kubeconfig), user_agent=user_agent, maxsize=connections)


def group_version_served(transport: ApiTransport, path: str, *, timeout: float) -> bool | None:
    """Whether the API server serves the group version at ``path`` (``/apis/resource.k8s.io/v1``):
    True, False (404: an older server, or the group switched off), or None when it could
    not be told (the server unreachable, an error status): the caller then assumes it is."""
    try:
        response = transport.request("GET", path, timeout=timeout)
        status = response.status
        # Read to the end before the connection goes back to the pool: left unread, the
        # body would be the next request's status line on that connection.
        response.drain_conn()
        response.release_conn()
    except TRANSIENT as err:
        logger.warning("cannot tell whether %s is served (%s)", path, describe(err))
        return None
    if status == 404:
        return False
    if 200 <= status < 300:
        return True
    logger.warning("cannot tell whether %s is served (HTTP %d)", path, status)
    return None


class CollectionRequests:
    """LIST and WATCH of one collection (``/api/v1/nodes``, a namespace's pods, the
    cluster's ResourceClaims) as raw responses, for :class:`~capwatch.kube.informer.Informer`;
    a label and a field selector narrow it. The agent's views and the controller's
    discovery list and watch through it."""

    def __init__(
        self,
        transport: ApiTransport,
        *,
        path: str,
        label_selector: str = "",
        field_selector: str = "",
    ) -> None:
        self._transport = transport
        self._path = path
        self._selector = label_selector
        self._fields = field_selector

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
        if self._fields:
            query["fieldSelector"] = self._fields
        return raw_get(self._transport, self._path, query=query, timeout=timeout)


def raw_get(
    transport: ApiTransport,
    path: str,
    *,
    query: dict[str, str] | None = None,
    timeout: tuple[float, float],
) -> urllib3.HTTPResponse:
    """GET path as a raw response (its body unread); an HTTP error status raises
    :class:`~capwatch.kube.wire.ApiStatusError`, the connection back in the pool."""
    raw = transport.request("GET", path, query=query, timeout=timeout)
    if not 200 <= raw.status < 300:
        try:
            reason = status_message(raw.data)
        finally:
            raw.release_conn()
        raise ApiStatusError(
            status=raw.status, reason=reason, retry_after=retry_after_seconds(raw.headers)
        )
    return raw


class ObjectRequests:
    """GET of single objects by path (a ResourceClaim by namespace and name), decoded.

    An HTTP error status raises :class:`~capwatch.kube.wire.ApiStatusError`; transport
    errors and an undecodable body raise :class:`ObjectReadError`, one line each.
    """

    def __init__(self, transport: ApiTransport, *, timeout: float) -> None:
        self._transport = transport
        self._timeout = timeout

    def get(self, path: str) -> dict[str, object]:
        try:
            return read_json(raw_get(self._transport, path, timeout=(self._timeout, self._timeout)))
        except TRANSIENT as err:
            raise ObjectReadError(f"GET {path}: {describe(err)}") from err


class ObjectReadError(CapwatchError):
    """A GET failed short of an HTTP answer (connection, timeout, a body not JSON)."""


def describe(err: BaseException) -> str:
    """A transport error in one line: its type and message."""
    return f"{type(err).__name__}: {err}"
