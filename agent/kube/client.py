"""The Kubernetes API through the ``kubernetes`` client package, the only module
that imports it: the client's configuration, the pod LIST and WATCH requests
behind the pod view (whose list+watch mechanics and sync rules are
:mod:`agent.kube.informer`'s), and the sink that posts :mod:`agent.podevents`' Events.

Requests ask the client for the raw urllib3 response (``_preload_content=False``)
rather than its pydantic models: the watch is streamed line by line and the JSON
is turned into :class:`~agent.pods.PodInfo` right at the boundary
(:func:`agent.kube.wire.pod_info`), so the only untyped values are the decoded
JSON mappings. The client's ``ApiException`` stays in here: it leaves as
:class:`~agent.kube.wire.ApiStatusError`.
"""

from __future__ import annotations

import http.client
import logging
import os
from typing import Any, cast

import kubernetes.client
import kubernetes.config
import urllib3
import urllib3.exceptions

from agent.kube.wire import ApiStatusError, read_json, retry_after_seconds, status_message
from agent.podevents import EventSinkError, PodEvent, event_body
from kit.clock import Clock
from kit.errors import CapwatchError, ConfigError

logger = logging.getLogger(__name__)

# What posting an Event can fail with, short of a bug: HTTP errors (ApiException),
# transport errors (urllib3, sockets, http.client framing), undecodable bodies.
_TRANSIENT = (
    kubernetes.client.ApiException,
    urllib3.exceptions.HTTPError,
    OSError,
    http.client.HTTPException,
    ValueError,
)


def api_client_from_environment(kubeconfig: str | None) -> kubernetes.client.ApiClient:
    """A ``kubernetes.client.ApiClient`` for this process's cluster.

    In-cluster service-account configuration when ``KUBERNETES_SERVICE_HOST`` is
    set, else the kubeconfig file (``None``: ``$KUBECONFIG`` or ``~/.kube/config``).
    urllib3's own retries are switched off: the pod view owns the retry policy,
    and hidden retries would multiply a hanging request's duration.
    TCP keepalive is on, as client-go has it, for long-lived idle watches.
    """
    configuration = kubernetes.client.Configuration()
    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        else:
            kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=configuration
            )
    except Exception as err:
        # The loaders raise ConfigException, OSError, YAML and key errors alike.
        option = "--kubeconfig" if not os.environ.get("KUBERNETES_SERVICE_HOST") else "in-cluster"
        raise ConfigError(option, f"cannot load Kubernetes client configuration: {err}") from err
    configuration.retries = False
    # TCP keepalive with client-go's timings: a watch through a proxy or load
    # balancer that silently drops idle flows is noticed (older clients ignore it).
    configuration.keep_alive = True
    return kubernetes.client.ApiClient(configuration)


def group_version_served(
    client: kubernetes.client.ApiClient, path: str, *, timeout: float
) -> bool | None:
    """Whether the API server serves the group version at ``path`` (``/apis/resource.k8s.io/v1``):
    True, False (404: an older server, or the group switched off), or None when it could
    not be told (the server unreachable, an error status): the caller then assumes it is."""
    try:
        _, url, headers, _, _ = client.param_serialize(
            "GET", path, header_params={"Accept": "application/json"}, auth_settings=["BearerToken"]
        )
        response = client.call_api("GET", url, header_params=headers, _request_timeout=timeout)
        status = response.response.status
        # Read to the end before the connection goes back to the pool: left unread, the
        # body would be the next request's status line on that connection.
        response.response.drain_conn()
        response.response.release_conn()
    except kubernetes.client.ApiException as err:
        status = int(err.status or 0)
    except _TRANSIENT as err:
        logger.warning("cannot tell whether %s is served (%s)", path, _describe(err))
        return None
    if status == 404:
        return False
    if 200 <= status < 300:
        return True
    logger.warning("cannot tell whether %s is served (HTTP %d)", path, status)
    return None


class KubernetesEventSink:
    """Creates pod Events (core/v1) for :class:`agent.podevents.PodEvents`."""

    def __init__(
        self,
        *,
        api_client: kubernetes.client.ApiClient,
        node_name: str,
        clock: Clock,
        release: str = "capwatch",
        request_timeout: float = 10.0,
    ) -> None:
        self._api = kubernetes.client.CoreV1Api(api_client)
        self._node = node_name
        self._release = release
        self._clock = clock
        self._timeout = request_timeout

    def post(self, event: PodEvent) -> None:
        body = event_body(
            event, node_name=self._node, wall=self._clock.wall(), release=self._release
        )
        try:
            # A plain dict body is serialized as is; the raw response is not parsed.
            response = cast(
                urllib3.HTTPResponse,
                self._api.create_namespaced_event(
                    event.pod.namespace,
                    cast(Any, body),
                    _preload_content=False,
                    _request_timeout=(self._timeout, self._timeout),
                ),
            )
            # Read to the end before the connection goes back to the pool: left unread,
            # the body would be the next request's status line (or cost a new connection).
            response.drain_conn()
            response.release_conn()
        except _TRANSIENT as err:
            raise EventSinkError(
                f"cannot create an event for pod {event.pod.namespace}/{event.pod.name}: "
                f"{_describe(err)}"
            ) from err


class KubernetesPodRequests:
    """The pod LIST and WATCH through the client, as raw responses (a
    :class:`~agent.kube.informer.ListWatchRequests`): cluster-wide, or in one namespace."""

    def __init__(
        self, api_client: kubernetes.client.ApiClient, *, node_name: str, namespace: str | None
    ) -> None:
        self._api = kubernetes.client.CoreV1Api(api_client)
        self._selector = f"spec.nodeName={node_name}"
        # None: every namespace (a ClusterRole); a name: that one (a namespaced Role).
        self._namespace = namespace

    def list(self, *, limit: int, continue_token: str, timeout: float) -> urllib3.HTTPResponse:
        extra: dict[str, Any] = {"_continue": continue_token} if continue_token else {}
        return self._request(limit=limit, _request_timeout=(timeout, timeout), **extra)

    def watch(
        self,
        *,
        resource_version: str,
        timeout_seconds: int,
        connect_timeout: float,
        read_timeout: float,
    ) -> urllib3.HTTPResponse:
        return self._request(
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            _request_timeout=(connect_timeout, read_timeout),
        )

    def _request(self, **kwargs: Any) -> urllib3.HTTPResponse:
        # With _preload_content=False the client returns the raw urllib3 response
        # (not the annotated V1PodList): the informer decodes the JSON itself.
        try:
            if self._namespace is None:
                response = self._api.list_pod_for_all_namespaces(
                    field_selector=self._selector, _preload_content=False, **kwargs
                )
            else:
                response = self._api.list_namespaced_pod(
                    self._namespace, field_selector=self._selector, _preload_content=False, **kwargs
                )
        except kubernetes.client.ApiException as err:
            raise ApiStatusError(
                status=int(err.status or 0),
                reason=str(err.reason or ""),
                retry_after=retry_after_seconds(err.headers),
            ) from err
        return cast(urllib3.HTTPResponse, response)


class CollectionRequests:
    """LIST and WATCH of one collection (``/api/v1/nodes``, a namespace's pods, the
    cluster's ResourceClaims) as raw responses, for :class:`~agent.kube.informer.Informer`;
    a label and a field selector narrow it. The agent's claims view and the controller's
    discovery list and watch through it."""

    def __init__(
        self,
        client: kubernetes.client.ApiClient,
        *,
        path: str,
        label_selector: str = "",
        field_selector: str = "",
    ) -> None:
        self._client = client
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
        return raw_get(self._client, self._path, query=query, timeout=timeout)


def raw_get(
    client: kubernetes.client.ApiClient,
    path: str,
    *,
    query: dict[str, str] | None = None,
    timeout: tuple[float, float],
) -> urllib3.HTTPResponse:
    """GET path as a raw response (its body unread); an HTTP error status raises
    :class:`~agent.kube.wire.ApiStatusError`, the connection back in the pool."""
    try:
        _, url, headers, _, _ = client.param_serialize(
            "GET",
            path,
            query_params=list((query or {}).items()),
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = client.call_api("GET", url, header_params=headers, _request_timeout=timeout)
    except kubernetes.client.ApiException as err:
        raise ApiStatusError(
            status=int(err.status or 0),
            reason=str(err.reason or ""),
            retry_after=retry_after_seconds(err.headers),
        ) from err
    raw: urllib3.HTTPResponse = response.response
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

    An HTTP error status raises :class:`~agent.kube.wire.ApiStatusError`; transport
    errors and an undecodable body raise :class:`ObjectReadError`, one line each.
    """

    def __init__(self, client: kubernetes.client.ApiClient, *, timeout: float) -> None:
        self._client = client
        self._timeout = timeout

    def get(self, path: str) -> dict[str, Any]:
        try:
            return read_json(raw_get(self._client, path, timeout=(self._timeout, self._timeout)))
        except _TRANSIENT as err:
            raise ObjectReadError(f"GET {path}: {_describe(err)}") from err


class ObjectReadError(CapwatchError):
    """A GET failed short of an HTTP answer (connection, timeout, a body not JSON)."""


def _describe(err: BaseException) -> str:
    if isinstance(err, kubernetes.client.ApiException):
        return f"HTTP {err.status} {err.reason}"
    return f"{type(err).__name__}: {err}"
