"""The pod view backed by the Kubernetes API: a list+watch cache of this node's pods
(and, as the only module that imports the ``kubernetes`` client package, the
sink that posts :mod:`agent.podevents`' Events).

The pod view follows the informer pattern: one LIST of the pods with
``spec.nodeName=<node>`` (all namespaces, paged), then a WATCH from the list's
resourceVersion with bookmarks, applied to an in-memory cache keyed by pod
UID. A 410 Gone (HTTP or ERROR event) triggers a relist; any other failure
retries the watch from the last resourceVersion after a bounded, jittered
exponential backoff. A watch that ends normally (its server-side
``timeoutSeconds``) resumes at once, no relist.

Pods in phase Succeeded/Failed stay in the cache until deleted: their processes
are gone, so they can never own a GPU, and dropping them would only add a rule.

Requests ask the client for the raw urllib3 response (``_preload_content=False``)
rather than its pydantic models: the watch is streamed line by line and the JSON
is turned into :class:`PodInfo` right at the boundary (:func:`agent.kubewire.pod_info`), so
the only untyped values are the decoded JSON mappings.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import random
import threading
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, cast

import kubernetes.client
import kubernetes.config
import urllib3
import urllib3.exceptions

from agent.clock import Clock
from agent.errors import ConfigError, PodViewError
from agent.kubewire import as_mapping, pod_info, shutdown_response, stream_lines
from agent.podevents import EventSinkError, PodEvent, event_body
from agent.pods import PodInfo, PodSnapshot

logger = logging.getLogger(__name__)

_GONE = 410

# What a request to the API server can fail with, short of a bug: HTTP errors
# (ApiException), transport errors (urllib3, sockets, http.client framing) and
# undecodable bodies (ValueError covers json.JSONDecodeError).
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


class KubernetesEventSink:
    """Creates pod Events (core/v1) for :class:`agent.podevents.PodEvents`."""

    def __init__(
        self,
        *,
        api_client: kubernetes.client.ApiClient,
        node_name: str,
        clock: Clock,
        request_timeout: float = 10.0,
    ) -> None:
        self._api = kubernetes.client.CoreV1Api(api_client)
        self._node = node_name
        self._clock = clock
        self._timeout = request_timeout

    def post(self, event: PodEvent) -> None:
        body = event_body(event, node_name=self._node, wall=self._clock.wall())
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
            response.release_conn()
        except _TRANSIENT as err:
            raise EventSinkError(
                f"cannot create an event for pod {event.pod.namespace}/{event.pod.name}: "
                f"{_describe(err)}"
            ) from err


@dataclass(frozen=True, kw_only=True)
class KubernetesPodViewStats:
    """Counters since construction, for metrics and benchmarks."""

    list_requests: int  # LIST HTTP requests, each page counted, failed ones too
    watch_requests: int  # WATCH HTTP requests, failed ones too
    relists: int  # full lists started because the watch answered 410 Gone
    errors: int  # failed requests and broken watch streams
    watch_events: int  # ADDED/MODIFIED/DELETED/BOOKMARK events applied


class _Gone(Exception):
    """The watch's resourceVersion is too old; only a relist helps."""


class _WatchError(Exception):
    """The watch stream carried an ERROR event other than 410."""


class KubernetesPodView:
    """A :class:`~agent.pods.PodView` kept current by list+watch in a daemon thread.

    ``snapshot()`` raises :class:`PodViewError` until the first list completes, and
    whenever requests have been failing for longer than ``stale_after`` seconds.
    """

    def __init__(
        self,
        *,
        node_name: str,
        api_client: kubernetes.client.ApiClient,
        namespace: str | None = None,
        clock: Clock,
        stale_after: float,
        backoff_initial: float = 0.2,
        backoff_max: float = 10.0,
        watch_timeout: float = 300.0,
        request_timeout: float = 30.0,
        page_size: int = 500,
        close_timeout: float = 1.0,
        rng: random.Random | None = None,
    ) -> None:
        if not node_name:
            raise ValueError("node_name must not be empty")
        if stale_after <= 0 or backoff_initial <= 0 or backoff_max < backoff_initial:
            raise ValueError("need stale_after > 0 and 0 < backoff_initial <= backoff_max")
        self._node = node_name
        self._api = kubernetes.client.CoreV1Api(api_client)
        self._clock = clock
        self._stale_after = stale_after
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._watch_timeout = max(1.0, watch_timeout)
        self._request_timeout = request_timeout
        self._page_size = page_size
        self._close_timeout = close_timeout
        self._rng = rng or random.Random()
        self._selector = f"spec.nodeName={node_name}"
        # None: every namespace (a ClusterRole); a name: that one (a namespaced Role).
        self._namespace = namespace

        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._active_response: urllib3.HTTPResponse | None = None  # so close() can cut it
        self._progress = False  # the current attempt has applied a watch event
        # Guarded by _lock: the cache and what snapshot() reports.
        self._pods: dict[str, PodInfo] = {}
        self._resource_version = ""
        self._published: PodSnapshot | None = None  # None: rebuild on next snapshot()
        self._listed = False
        self._down_since: float | None = None
        self._last_error = ""
        self._list_requests = 0
        self._watch_requests = 0
        self._relists = 0
        self._errors = 0
        self._watch_events = 0

    # -- public -----------------------------------------------------------------

    def start(self) -> None:
        """Start the list+watch thread. Calling it twice is an error."""
        if self._thread is not None:
            raise RuntimeError("KubernetesPodView already started")
        self._thread = threading.Thread(
            target=self._run, name=f"capwatch-podview-{self._node}", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop the thread, cutting an open watch. Idempotent; returns within
        ``close_timeout`` even if a LIST is stuck (the daemon thread then exits
        when that request returns or times out)."""
        with self._lock:
            self._stop.set()
            response = self._active_response
        if response is not None:
            shutdown_response(response)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self._close_timeout)

    def snapshot(self) -> PodSnapshot:
        with self._lock:
            if self._stop.is_set():
                raise PodViewError("pod view is closed")
            if not self._listed:
                detail = f"; last error: {self._last_error}" if self._last_error else ""
                raise PodViewError(
                    f"pod view not synced: initial list of pods on node {self._node}"
                    f" has not completed{detail}"
                )
            if self._down_since is not None:
                down_for = self._clock.monotonic() - self._down_since
                if down_for > self._stale_after:
                    raise PodViewError(
                        f"pod view stale: API server unreachable for {down_for:.1f}s"
                        f" (stale_after={self._stale_after}s); last error: {self._last_error}"
                    )
            if self._published is None:
                self._published = PodSnapshot(
                    pods=MappingProxyType(dict(self._pods)),
                    resource_version=self._resource_version,
                )
            return self._published

    def stats(self) -> KubernetesPodViewStats:
        with self._lock:
            return KubernetesPodViewStats(
                list_requests=self._list_requests,
                watch_requests=self._watch_requests,
                relists=self._relists,
                errors=self._errors,
                watch_events=self._watch_events,
            )

    # -- the loop ---------------------------------------------------------------

    def _run(self) -> None:
        need_list = True
        attempt = 0
        while not self._stop.is_set():
            retry_after: float | None = None
            self._progress = False
            listed_now = False
            try:
                if need_list:
                    self._list()
                    need_list, listed_now = False, True
                self._watch()
                attempt = 0
                continue
            except _Gone as err:
                logger.info("watch expired, relisting node=%s reason=%s", self._node, err)
                need_list = True
                self._mark_down(f"watch expired: {err}", count_error=False)
                with self._lock:
                    self._relists += 1
                if not (listed_now and not self._progress):
                    # The normal case: relist at once. A 410 straight after a fresh
                    # list would loop, so that one backs off below.
                    continue
            except (*_TRANSIENT, _WatchError) as err:
                if isinstance(err, kubernetes.client.ApiException) and err.status == 429:
                    retry_after = _retry_after_seconds(err)
                self._mark_down(_describe(err))
            except Exception as err:
                # A bug must not kill the view silently: log it, back off, go on.
                logger.exception("pod view loop failed node=%s", self._node)
                self._mark_down(f"internal error: {err!r}")
            if self._stop.is_set():
                break
            if self._progress:
                # The stream worked for a while before failing: start backoff afresh.
                attempt = 0
            delay = self._backoff(attempt, retry_after)
            attempt += 1
            logger.warning(
                "pod view request failed node=%s retry_in=%.2fs error=%s",
                self._node,
                delay,
                self._last_error,
            )
            self._clock.sleep(delay, self._stop)

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        """Full exponential delay, jittered down by up to half; Retry-After as a floor."""
        base = min(self._backoff_max, self._backoff_initial * (2.0 ** min(attempt, 30)))
        delay = base * (0.5 + 0.5 * self._rng.random())
        if retry_after is not None:
            delay = max(delay, min(retry_after, self._backoff_max))
        return delay

    def _mark_down(self, reason: str, *, count_error: bool = True) -> None:
        with self._lock:
            if count_error:
                self._errors += 1
            self._last_error = reason
            if self._down_since is None:
                self._down_since = self._clock.monotonic()

    def _mark_up(self) -> None:
        with self._lock:
            self._down_since = None

    def _request_pods(self, **kwargs: Any) -> Any:
        """The pods LIST (or WATCH) request, cluster-wide or in one namespace."""
        if self._namespace is None:
            return self._api.list_pod_for_all_namespaces(**kwargs)
        return self._api.list_namespaced_pod(self._namespace, **kwargs)

    # -- list -------------------------------------------------------------------

    def _list(self) -> None:
        pods: dict[str, PodInfo] = {}
        token = ""
        while True:
            with self._lock:
                self._list_requests += 1
            kwargs: dict[str, Any] = {}
            if token:
                kwargs["_continue"] = token
            # With _preload_content=False the client returns the raw urllib3
            # response (not the annotated V1PodList): we decode the JSON ourselves.
            response = cast(
                urllib3.HTTPResponse,
                self._request_pods(
                    field_selector=self._selector,
                    limit=self._page_size,
                    _preload_content=False,
                    _request_timeout=(self._request_timeout, self._request_timeout),
                    **kwargs,
                ),
            )
            body = self._read_json(response)
            for item in body.get("items") or []:
                info = pod_info(as_mapping(item))
                if info is not None:
                    pods[info.ref.uid] = info
            metadata = as_mapping(body.get("metadata"))
            token = str(metadata.get("continue") or "")
            if not token:
                break
            if self._stop.is_set():
                return
        resource_version = str(metadata.get("resourceVersion") or "")
        with self._lock:
            self._pods = pods
            self._resource_version = resource_version
            self._published = None
            self._listed = True
            self._down_since = None
        logger.info(
            "listed pods node=%s pods=%d resource_version=%s",
            self._node,
            len(pods),
            resource_version,
        )

    @staticmethod
    def _read_json(response: urllib3.HTTPResponse) -> dict[str, Any]:
        try:
            data = response.data
        finally:
            response.release_conn()
        decoded = json.loads(data)
        if not isinstance(decoded, dict):
            raise ValueError(f"expected a JSON object, got {type(decoded).__name__}")
        return decoded

    # -- watch ------------------------------------------------------------------

    def _watch(self) -> None:
        """One watch request; returns when the server ends it normally."""
        if self._stop.is_set():
            return
        with self._lock:
            self._watch_requests += 1
            resource_version = self._resource_version
        # Jittered so a fleet of agents does not reconnect in lockstep.
        timeout_seconds = int(self._watch_timeout * (1.0 + 0.25 * self._rng.random()))
        try:
            response = cast(
                urllib3.HTTPResponse,
                self._request_pods(
                    field_selector=self._selector,
                    watch=True,
                    allow_watch_bookmarks=True,
                    resource_version=resource_version,
                    timeout_seconds=timeout_seconds,
                    _preload_content=False,
                    # A read timeout past the server's end notices a dead connection.
                    _request_timeout=(
                        self._request_timeout,
                        timeout_seconds + self._request_timeout,
                    ),
                ),
            )
        except kubernetes.client.ApiException as err:
            if err.status == _GONE:
                raise _Gone(f"HTTP 410: {err.reason}") from err
            raise
        with self._lock:
            if self._stop.is_set():
                stopping = True
            else:
                stopping = False
                self._active_response = response
        if stopping:
            response.close()
            return
        self._mark_up()
        try:
            for line in stream_lines(response):
                if self._stop.is_set():
                    return
                self._apply(line)
                self._progress = True
        finally:
            with self._lock:
                self._active_response = None
            # Closing (not just releasing) keeps a half-read stream out of the pool.
            response.close()
            response.release_conn()

    def _apply(self, line: str) -> None:
        event = json.loads(line)
        if not isinstance(event, dict):
            raise ValueError(f"watch event is not an object: {line[:200]!r}")
        kind = event.get("type")
        obj = as_mapping(event.get("object"))
        if kind == "ERROR":
            code = obj.get("code")
            message = f"{obj.get('reason', '')}: {obj.get('message', '')}"
            if code == _GONE:
                raise _Gone(f"ERROR event 410 {message}")
            raise _WatchError(f"ERROR event code={code} {message}")
        resource_version = str(as_mapping(obj.get("metadata")).get("resourceVersion") or "")
        with self._lock:
            self._watch_events += 1
            if resource_version:
                self._resource_version = resource_version
            if kind in ("ADDED", "MODIFIED"):
                info = pod_info(obj)
                if info is not None:
                    self._pods[info.ref.uid] = info
            elif kind == "DELETED":
                uid = str(as_mapping(obj.get("metadata")).get("uid") or "")
                self._pods.pop(uid, None)
            elif kind != "BOOKMARK":
                logger.warning("ignoring watch event node=%s type=%s", self._node, kind)
            self._published = None


def _retry_after_seconds(err: kubernetes.client.ApiException) -> float | None:
    """The Retry-After header in seconds (the HTTP-date form is not used by Kubernetes)."""
    value = (err.headers or {}).get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _describe(err: BaseException) -> str:
    if isinstance(err, kubernetes.client.ApiException):
        return f"HTTP {err.status} {err.reason}"
    return f"{type(err).__name__}: {err}"
