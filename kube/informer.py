"""The informer pattern: a list+watch of one kind of object, and when it may be trusted.

One LIST (paged), then a WATCH from the list's resourceVersion with bookmarks,
each object handed to a :class:`Store`. A 410 Gone (HTTP or ERROR event)
triggers a relist; any other failure retries the watch from the last
resourceVersion after a bounded, jittered exponential backoff. A watch that
ends normally resumes at once from the last resourceVersion, with no LIST.
It runs on a daemon thread; the store is called on that thread.

:meth:`Informer.sync_problem` says why the store cannot be trusted now, or
None when it can. Known in sync means all of:

- the first LIST has completed;
- requests have not been failing for longer than ``stale_after``;
- the API server has *delivered* something within the silence bound ``B``
  (30 s by default): a LIST completed, a watch event arrived (a BOOKMARK
  counts), or a watch ended cleanly. A watch that was opened and has sent
  nothing since does not count: a stalled server or a dead connection looks
  exactly like that.

A healthy quiet watch stays inside the bound because each watch asks the
server to end it after ``timeoutSeconds`` drawn from ``[B/2, 2B/3]`` (15-20 s
by default; jittered so a fleet does not reconnect in step); the end itself,
a clean one, counts as delivery (the API server sends a BOOKMARK before it
only when the kind changed after the watch opened). After a clean end the next
watch goes out at once, from the last resourceVersion and on the same pooled
connection: one cheap request per watch period, no LIST. The socket read
timeout is ``B`` as well, so a watch that sends no byte for ``B`` seconds is
abandoned and re-opened (from the last resourceVersion, no LIST).

The requests themselves (:class:`ListWatchRequests`) are the client library's
business (one module per package imports it); their raw responses are decoded
here with :mod:`capwatch.kube.wire`. The agent's pod view is built on this in
:mod:`capwatch.agent.kube.podview`, where the exact worst case for pods is written down.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import urllib3
import urllib3.exceptions

from capwatch.kit.backoff import Backoff
from capwatch.kit.clock import Clock
from capwatch.kube.wire import (
    TRANSIENT,
    ApiStatusError,
    as_mapping,
    read_json,
    shutdown_response,
    stream_lines,
)

logger = logging.getLogger(__name__)

DEFAULT_SILENCE_BOUND_S = 30.0
# timeoutSeconds is whole seconds and must end a watch well inside the bound.
MIN_SILENCE_BOUND_S = 2.0

_GONE = 410

# What a request to the API server can fail with, short of a bug: an HTTP error
# answer, or what wire.TRANSIENT names.
_TRANSIENT = (ApiStatusError, *TRANSIENT)


class ListWatchRequests(Protocol):
    """The informer's two requests, answered as raw, unread urllib3 responses.

    An HTTP error status raises :class:`~capwatch.kube.wire.ApiStatusError`; transport
    failures raise what urllib3 and the socket raise.
    """

    def list(self, *, limit: int, continue_token: str, timeout: float) -> urllib3.HTTPResponse:
        """One page of the LIST."""
        ...

    def watch(
        self,
        *,
        resource_version: str,
        timeout_seconds: int,
        connect_timeout: float,
        read_timeout: float,
    ) -> urllib3.HTTPResponse:
        """A streamed WATCH with bookmarks, from ``resource_version``."""
        ...


@dataclass(frozen=True, kw_only=True)
class WatchPolicy:
    """How the informer talks to the API server, and how long it trusts it (seconds)."""

    stale_after: float  # requests failing for longer than this: not synced
    silence_bound: float = DEFAULT_SILENCE_BOUND_S  # nothing delivered for longer: not synced
    backoff_initial: float = 0.2
    backoff_max: float = 10.0
    request_timeout: float = 30.0  # every connect, and a LIST page's reads
    page_size: int = 500
    close_timeout: float = 1.0

    def __post_init__(self) -> None:
        if self.stale_after <= 0 or not 0 < self.backoff_initial <= self.backoff_max:
            raise ValueError("need stale_after > 0 and 0 < backoff_initial <= backoff_max")
        if not self.silence_bound >= MIN_SILENCE_BOUND_S:
            raise ValueError(f"silence_bound must be at least {MIN_SILENCE_BOUND_S:g}s")

    def watch_timeout_seconds(self, rng: random.Random) -> int:
        """The next watch's server-side ``timeoutSeconds``: in ``[B/2, 2B/3]``, whole."""
        return max(1, int(self.silence_bound * (0.5 + rng.random() / 6)))


class Store(Protocol):
    """Where an informer puts what it lists and watches (called on its thread)."""

    def replace(self, objects: list[Mapping[str, Any]]) -> None:
        """A LIST completed: these are all the objects there are."""

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        """A watch event: ``kind`` is ADDED, MODIFIED or DELETED."""


@dataclass(frozen=True, kw_only=True)
class InformerStats:
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


class Informer:
    """A list+watch of one kind of object into a :class:`Store`, on a daemon thread."""

    def __init__(
        self,
        *,
        what: str,
        requests: ListWatchRequests,
        store: Store,
        clock: Clock,
        policy: WatchPolicy,
        rng: random.Random | None = None,
        trim: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
    ) -> None:
        """``what`` names the objects in logs and problems (``pods on node n1``);
        ``trim`` keeps of each object only what the store reads, as it is decoded (a
        list of thousands of Nodes is never held whole, nor their managedFields)."""
        self._what = what
        self._trim = trim or _whole
        self._requests = requests
        self._store = store
        self._clock = clock
        self._policy = policy
        self._rng = rng or random.Random()
        self._retry = Backoff(initial_s=policy.backoff_initial, max_s=policy.backoff_max)

        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._active_response: urllib3.HTTPResponse | None = None  # so close() can cut it
        self._progress = False  # the current attempt has applied a watch event
        # Guarded by _lock.
        self._resource_version = ""
        self._listed = False
        self._down_since: float | None = None
        self._delivered_at = 0.0  # the API server's last delivery (monotonic)
        self._last_error = ""
        self._failing_status: int | None = None  # the HTTP status it is down with
        self._list_requests = 0
        self._watch_requests = 0
        self._relists = 0
        self._errors = 0
        self._watch_events = 0

    @property
    def policy(self) -> WatchPolicy:
        return self._policy

    @property
    def closed(self) -> bool:
        return self._stop.is_set()

    @property
    def resource_version(self) -> str:
        with self._lock:
            return self._resource_version

    # -- public -----------------------------------------------------------------

    def start(self, thread_name: str) -> None:
        """Start the list+watch thread. Calling it twice is an error."""
        if self._thread is not None:
            raise RuntimeError(f"informer of {self._what} already started")
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
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
            thread.join(self._policy.close_timeout)

    def sync_problem(self) -> str | None:
        """Why the store cannot be trusted now (the module docstring's rules); None if it can.

        The text starts with ``not synced`` or ``stale``.
        """
        with self._lock:
            detail = f"; last error: {self._last_error}" if self._last_error else ""
            if not self._listed:
                return f"not synced: initial list of {self._what} has not completed{detail}"
            now = self._clock.monotonic()
            if self._down_since is not None:
                down_for = now - self._down_since
                if down_for > self._policy.stale_after:
                    return (
                        f"stale: API server unreachable for {down_for:.1f}s"
                        f" (stale_after={self._policy.stale_after:g}s){detail}"
                    )
            silent_for = now - self._delivered_at
            if silent_for > self._policy.silence_bound:
                return (
                    f"not synced: the API server delivered nothing for"
                    f" {silent_for:.1f}s (silence bound {self._policy.silence_bound:g}s)"
                    f", the watch may be stalled{detail}"
                )
            return None

    @property
    def failing_status(self) -> int | None:
        """The HTTP status its last request failed with, while it has not recovered
        (404: the collection is not served); None when up, or down for another reason."""
        with self._lock:
            return self._failing_status

    def stats(self) -> InformerStats:
        with self._lock:
            return InformerStats(
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
                logger.info("watch expired, relisting what=%r reason=%s", self._what, err)
                need_list = True
                self._mark_down(f"watch expired: {err}", count_error=False)
                with self._lock:
                    self._relists += 1
                if not (listed_now and not self._progress):
                    # The normal case: relist at once. A 410 straight after a fresh
                    # list would loop, so that one backs off below.
                    continue
            except (*_TRANSIENT, _WatchError) as err:
                status = err.status if isinstance(err, ApiStatusError) else None
                if status == 429:
                    retry_after = err.retry_after  # type: ignore[union-attr]
                self._mark_down(_describe(err), status=status)
            except Exception as err:
                # A bug must not kill the view silently: log it, back off, go on.
                logger.exception("informer loop failed what=%r", self._what)
                self._mark_down(f"internal error: {err!r}")
            if self._stop.is_set():
                break
            if self._progress:
                # The stream worked for a while before failing: start backoff afresh.
                attempt = 0
            delay = self._backoff(attempt, retry_after)
            attempt += 1
            logger.warning(
                "list/watch request failed what=%r retry_in=%.2fs error=%s",
                self._what,
                delay,
                self._last_error,
            )
            self._clock.sleep(delay, self._stop)

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        """The one backoff (full jitter under the ceiling); Retry-After as a floor."""
        return self._retry.delay(attempt, self._rng, floor_s=retry_after)

    def _mark_down(
        self, reason: str, *, count_error: bool = True, status: int | None = None
    ) -> None:
        with self._lock:
            if count_error:
                self._errors += 1
            self._last_error = reason
            self._failing_status = status
            if self._down_since is None:
                self._down_since = self._clock.monotonic()

    def _mark_up(self) -> None:
        with self._lock:
            self._down_since = None
            self._failing_status = None

    def _delivered(self) -> None:
        """The API server delivered something: the silence clock restarts."""
        with self._lock:
            self._delivered_at = self._clock.monotonic()

    # -- list -------------------------------------------------------------------

    def _list(self) -> None:
        objects: list[Mapping[str, Any]] = []
        token = ""
        while True:
            with self._lock:
                self._list_requests += 1
            body = read_json(
                self._requests.list(
                    limit=self._policy.page_size,
                    continue_token=token,
                    timeout=self._policy.request_timeout,
                )
            )
            # Taken out of the page: its whole objects go now, not with the next page.
            items = body.pop("items", None) or []
            objects += [self._trim(as_mapping(item)) for item in items]
            del items
            metadata = as_mapping(body.get("metadata"))
            token = str(metadata.get("continue") or "")
            if not token:
                break
            if self._stop.is_set():
                return
        resource_version = str(metadata.get("resourceVersion") or "")
        with self._lock:
            self._store.replace(objects)
            self._resource_version = resource_version
            self._listed = True
            self._down_since = None
            self._failing_status = None
            self._delivered_at = self._clock.monotonic()
        logger.info(
            "listed what=%r objects=%d resource_version=%s",
            self._what,
            len(objects),
            resource_version,
        )

    # -- watch ------------------------------------------------------------------

    def _watch(self) -> None:
        """One watch request; returns when the server ends it normally."""
        if self._stop.is_set():
            return
        with self._lock:
            self._watch_requests += 1
            resource_version = self._resource_version
        try:
            response = self._requests.watch(
                resource_version=resource_version,
                timeout_seconds=self._policy.watch_timeout_seconds(self._rng),
                connect_timeout=self._policy.request_timeout,
                # A watch that sends no byte for the silence bound is given up.
                read_timeout=self._policy.silence_bound,
            )
        except ApiStatusError as err:
            if err.status == _GONE:
                raise _Gone(f"HTTP 410: {err.reason}") from err
            raise
        with self._lock:
            stopping = self._stop.is_set()
            if not stopping:
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
            self._delivered()  # a clean end: the server is there and has said all
        finally:
            with self._lock:
                self._active_response = None
            # Closing (not just releasing) keeps a half-read stream out of the pool;
            # a stream read to its end has already returned its connection to the
            # pool, and the next watch reuses it.
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
            self._delivered_at = self._clock.monotonic()
            if resource_version:
                self._resource_version = resource_version
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self._store.apply(str(kind), self._trim(obj))
            elif kind != "BOOKMARK":
                logger.warning("ignoring watch event what=%r type=%s", self._what, kind)


def _whole(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj


def _describe(err: BaseException) -> str:
    if isinstance(err, ApiStatusError):
        return str(err)
    return f"{type(err).__name__}: {err}"
