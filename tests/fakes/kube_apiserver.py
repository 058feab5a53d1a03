"""An in-process fake Kubernetes API server that speaks the real wire format.

A real HTTP/1.1 server on 127.0.0.1 (ephemeral port) in a background thread,
serving the pod collection endpoints the real ``kubernetes`` client calls:

- ``GET /api/v1/pods`` and ``GET /api/v1/namespaces/{ns}/pods``: ``PodList``
  JSON with ``metadata.resourceVersion``, ``limit``/``continue`` paging and
  ``fieldSelector`` (unsupported selectors answer 400 with a ``Status`` body).
- the same with ``watch=true``: a chunked stream of newline-delimited watch
  events after ``resourceVersion`` (ADDED, MODIFIED, DELETED, BOOKMARK when
  ``allowWatchBookmarks``, ERROR), ending cleanly after ``timeoutSeconds``.
  A resourceVersion older than the retained history is answered 410 Gone,
  either as an HTTP 410 or as an ERROR event carrying a ``Status`` (``gone_mode``).

Tests drive it through the methods below: write pods, emit bookmarks, compact
history, inject 429/500 answers, hang lists, drop/end/stall watch streams, and
read request counts. The pod state lives in :class:`~tests.fakes.kube_store.PodStore`.
"""

from __future__ import annotations

import contextlib
import json
import socketserver
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from tests.fakes.kube_events import EventsEndpoint
from tests.fakes.kube_store import (
    ExpiredError,
    FieldSelector,
    ListPage,
    Pod,
    PodStore,
    SelectorError,
    status_body,
)
from tests.fakes.kube_watch import WatchEndpoint

RequestKind = Literal["list", "watch", "event"]
GoneMode = Literal["http", "event"]


@dataclass(frozen=True, kw_only=True)
class RequestRecord:
    """One request the server received (before any injected failure)."""

    kind: RequestKind
    path: str
    query: dict[str, str]
    at: float  # time.monotonic()
    peer: int = 0  # the client's port: one TCP connection per distinct value


@dataclass(kw_only=True)
class _Fault:
    code: int
    retry_after: int | None
    in_stream: bool


@dataclass(kw_only=True)
class _Controls:
    """Mutable test controls; guarded by the store's lock."""

    faults: dict[str, list[_Fault]] = field(
        default_factory=lambda: {"list": [], "watch": [], "event": []}
    )
    list_hangs: list[float] = field(default_factory=list)
    drop_gen: int = 0
    end_gen: int = 0
    bookmark_gen: int = 0
    stalled: bool = False
    stopping: bool = False
    open_watches: int = 0


class FakeKubeApiServer:
    """The fake API server. ``start()`` before use, ``stop()`` after."""

    def __init__(
        self,
        *,
        gone_mode: GoneMode = "event",
        history_limit: int = 1000,
        bookmark_frequency: float = 60.0,
    ) -> None:
        self.store = PodStore(history_limit=history_limit)
        self.gone_mode: GoneMode = gone_mode
        # Seconds between the periodic BOOKMARKs of a watch that allows them.
        self.bookmark_frequency = bookmark_frequency
        self._ctl = _Controls()
        self._requests: list[RequestRecord] = []
        self._events: list[dict[str, Any]] = []  # created by POST (tests/fakes/kube_events.py)
        self._stop = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------

    def start(self) -> None:
        handler = type("Handler", (_Handler,), {"fake": self})
        self._httpd = _Server(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-kube-apiserver",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and cut open watches and hung lists. Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        with self.store.cond:
            self._ctl.stopping = True
            self.store.cond.notify_all()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def url(self) -> str:
        assert self._httpd is not None, "server not started"
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    # -- pods (thin delegation to the store) ------------------------------------

    def add_pod(
        self,
        namespace: str,
        name: str,
        *,
        node: str,
        annotations: dict[str, str] | None = None,
        phase: str = "Running",
        uid: str | None = None,
    ) -> Pod:
        return self.store.add_pod(
            namespace, name, node=node, annotations=annotations, phase=phase, uid=uid
        )

    def update_pod(
        self,
        namespace: str,
        name: str,
        *,
        annotations: dict[str, str] | None = None,
        node: str | None = None,
        phase: str | None = None,
    ) -> Pod:
        return self.store.update_pod(
            namespace, name, annotations=annotations, node=node, phase=phase
        )

    def delete_pod(self, namespace: str, name: str) -> None:
        self.store.delete_pod(namespace, name)

    @property
    def resource_version(self) -> int:
        return self.store.resource_version

    def atomic(self) -> contextlib.AbstractContextManager[None]:
        """Hold the server's lock: no watcher sees any of the changes made inside
        until all of them are done (combine with drop_watches + compact to make a
        watcher miss events and come back to a 410)."""
        return self.store.atomic()

    def compact(self) -> None:
        """Forget history up to now; a watch from an older rv gets 410."""
        self.store.compact()

    # -- stream controls --------------------------------------------------------

    def bookmark(self) -> None:
        """Send a BOOKMARK at the current rv on every open watch that allows them."""
        self._bump("bookmark_gen")

    def drop_watches(self) -> None:
        """Abort every open watch connection mid-stream (no terminating chunk)."""
        self._bump("drop_gen")

    def end_watches(self) -> None:
        """End every open watch cleanly, as the server does at ``timeoutSeconds``."""
        self._bump("end_gen")

    def stall_watches(self, stalled: bool = True) -> None:
        """Open watches (and new ones) go silent: no events, no end, until unstalled."""
        with self.store.cond:
            self._ctl.stalled = stalled
            self.store.cond.notify_all()

    def _bump(self, name: str) -> None:
        with self.store.cond:
            setattr(self._ctl, name, getattr(self._ctl, name) + 1)
            self.store.cond.notify_all()

    # -- fault injection --------------------------------------------------------

    def fail_next(
        self,
        kind: RequestKind,
        code: int,
        *,
        count: int = 1,
        retry_after: int | None = None,
        in_stream: bool = False,
    ) -> None:
        """The next ``count`` requests of ``kind`` answer ``code`` with a Status body;
        ``in_stream`` (watches only): a 200 stream carrying one ERROR event instead."""
        with self.store.cond:
            self._ctl.faults[kind].extend(
                _Fault(code=code, retry_after=retry_after, in_stream=in_stream)
                for _ in range(count)
            )

    def clear_faults(self) -> None:
        with self.store.cond:
            for faults in self._ctl.faults.values():
                faults.clear()
            self._ctl.list_hangs.clear()

    def hang_next_lists(self, seconds: float, *, count: int = 1) -> None:
        """The next ``count`` lists wait ``seconds`` before answering."""
        with self.store.cond:
            self._ctl.list_hangs.extend([seconds] * count)

    # -- observation ------------------------------------------------------------

    def count(self, kind: RequestKind) -> int:
        with self.store.cond:
            return sum(1 for r in self._requests if r.kind == kind)

    def requests(self, kind: RequestKind | None = None) -> list[RequestRecord]:
        with self.store.cond:
            return [r for r in self._requests if kind is None or r.kind == kind]

    def events(self) -> list[dict[str, Any]]:
        with self.store.cond:
            return list(self._events)

    def _admit_event(self, path: str) -> _Fault | None:
        fault, _ = self._admit(
            RequestRecord(kind="event", path=path, query={}, at=time.monotonic())
        )
        return fault

    def _record_event(self, event: dict[str, Any]) -> None:
        with self.store.cond:
            self._events.append(event)

    @property
    def open_watches(self) -> int:
        with self.store.cond:
            return self._ctl.open_watches

    # -- used by the handler ----------------------------------------------------

    def _admit(self, record: RequestRecord) -> tuple[_Fault | None, float]:
        with self.store.cond:
            self._requests.append(record)
            faults = self._ctl.faults[record.kind]
            fault = faults.pop(0) if faults else None
            hang = 0.0
            if fault is None and record.kind == "list" and self._ctl.list_hangs:
                hang = self._ctl.list_hangs.pop(0)
            return fault, hang


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host name (getfqdn), which can take
        # seconds in a sandbox; the fake only ever serves 127.0.0.1.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "127.0.0.1", self.server_address[1]


class _Handler(EventsEndpoint, WatchEndpoint, BaseHTTPRequestHandler):
    fake: FakeKubeApiServer  # set on the per-server subclass
    protocol_version = "HTTP/1.1"
    server_version = "fake-kube-apiserver/1"
    timeout = 10  # idle keep-alive connections do not pin a thread forever
    # Headers and body go out in separate writes; without TCP_NODELAY, Nagle plus
    # delayed ACKs add ~40 ms to every response.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        # Quiet: the test output is for the tests.
        pass

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        parts = url.path.strip("/").split("/")
        is_pods = parts == ["api", "v1", "pods"] or (
            len(parts) == 5 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods"
        )
        if not is_pods:
            self._send_json(404, status_body(404, f"the server could not find {url.path}"))
            return
        namespace = parts[3] if len(parts) == 5 else None
        watching = query.get("watch", "").lower() in ("true", "1")
        kind: RequestKind = "watch" if watching else "list"
        fault, hang = self.fake._admit(
            RequestRecord(
                kind=kind,
                path=url.path,
                query=query,
                at=time.monotonic(),
                peer=int(self.client_address[1]),
            )
        )
        if fault is not None and fault.in_stream and watching:
            self._send_stream_error(status_body(fault.code, "injected fault"))
            return
        if fault is not None:
            headers = {}
            if fault.retry_after is not None:
                headers["Retry-After"] = str(fault.retry_after)
            self._send_json(fault.code, status_body(fault.code, "injected fault"), headers)
            return
        if hang and self.fake._stop.wait(hang):
            self._abort()
            return
        try:
            selector = FieldSelector.parse(query.get("fieldSelector"))
            if namespace is not None:
                selector = FieldSelector(
                    terms=(*selector.terms, ("metadata.namespace", namespace, False))
                )
            # labelSelector is ignored: nothing in capwatch selects pods by label.
            if watching:
                self._watch(selector, query)
            else:
                self._list(selector, query)
        except SelectorError as err:
            self._send_json(400, status_body(400, str(err)))
        except ExpiredError as err:
            self._send_json(410, status_body(410, str(err)))

    # -- list -------------------------------------------------------------------

    def _list(self, selector: FieldSelector, query: dict[str, str]) -> None:
        try:
            limit = int(query.get("limit") or 0)
        except ValueError as err:
            raise SelectorError(f"invalid limit: {query['limit']!r}") from err
        # resourceVersion on a list: "", "0" and any exact version are all served
        # from the current state (at least as new as asked), which is what a
        # NotOlderThan read may return.
        page: ListPage = self.fake.store.list_page(
            selector, limit=limit, token=query.get("continue", "")
        )
        metadata: dict[str, Any] = {"resourceVersion": str(page.resource_version)}
        if page.continue_token:
            metadata["continue"] = page.continue_token
            metadata["remainingItemCount"] = page.remaining
        body = {"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": page.items}
        self._send_json(200, body)

    def _send_json(
        self, code: int, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(data)
