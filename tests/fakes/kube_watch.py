"""The fake API server's watch streams: ``GET <collection>?watch=true`` of any kind.

A mixin for the fake's request handler, serving pods and nodes alike from
their :class:`~tests.fakes.kube_store.ObjectStore`. A watch is a chunked
stream of newline-delimited events after ``resourceVersion`` (ADDED,
MODIFIED, DELETED, ERROR; objects carry kind/apiVersion), ending cleanly after
``timeoutSeconds``; with ``resourceVersion`` "" or "0" it starts with the
current state as ADDED. Field and label selectors apply: an object that stops
matching is sent as DELETED, one that starts matching as ADDED. With
``allowWatchBookmarks`` it also carries BOOKMARKs as the real watch cache
sends them: every ``bookmark_frequency`` seconds (a minute by default) and
once 2 s before the watch's deadline, each only once the resourceVersion has
moved past what the watch was opened at, that is once an object of the
watched kind changed after the watch was opened, matching the selector or
not (as the real cacher decides it: a watch replaying history gets none for
the history, a quiet one none at all; one from "0" compares with the newest
object it was sent), plus any a test asks for.
A ``resourceVersion`` that is not an unsigned integer answers 500 (as the
real server does, with no reason). The test
controls (:class:`WatchControls`) reach every open stream of every kind: drop
(no terminating chunk), end (cleanly), stall (the connection stays open and
nothing is sent, not even the end, until unstalled). A stream whose client is
cut off (kube_faults) goes silent in hang mode and is dropped in status mode.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.kube_selectors import Selector
from tests.fakes.kube_store import ExpiredError, Obj, ObjectStore
from tests.fakes.kube_wire import bookmark_object, status_body, typed

# The real watch cache's bookmark before a watch's deadline (cacher.go).
PRETIMEOUT_BOOKMARK_S = 2.0


@dataclass(kw_only=True)
class WatchControls:
    """The test's controls over open streams; guarded by the server's shared lock."""

    drop_gen: int = 0
    end_gen: int = 0
    bookmark_gen: int = 0
    stalled: bool = False
    stopping: bool = False
    open_watches: dict[str, int] = field(default_factory=dict)  # by request kind


@dataclass(kw_only=True)
class WatchState:
    """One open watch: where it is in the history and which controls it has seen."""

    store: ObjectStore
    selector: Selector
    user_agent: str
    bookmarks: bool
    deadline: float | None
    cursor: int
    drop_gen: int
    end_gen: int
    bookmark_gen: int
    next_bookmark: float | None = None
    start_rv: int = 0  # scheduled bookmarks go out only once the kind moved past this
    pending: list[tuple[str, Obj]] = field(default_factory=list)

    def schedule_bookmark(self, now: float, frequency: float) -> None:
        """The real cacher's rule: every ``frequency``, and 2 s before the deadline."""
        if not self.bookmarks:
            self.next_bookmark = None
            return
        when = now + frequency
        if self.deadline is not None:
            when = min(when, self.deadline - PRETIMEOUT_BOOKMARK_S)
        self.next_bookmark = when if when > now else None

    def event(self, kind: str, obj: Obj) -> dict[str, Any]:
        return {"type": kind, "object": typed(obj, self.store.kind, self.store.api_version)}

    def bookmark(self) -> dict[str, Any]:
        rv = self.cursor
        return {
            "type": "BOOKMARK",
            "object": bookmark_object(rv, self.store.kind, self.store.api_version),
        }


class WatchEndpoint:
    """Mixed into the handler, which supplies ``fake``, ``wfile``, ``connection``,
    ``headers``, ``send_response``/``send_header``/``end_headers`` and ``close_connection``."""

    def _watch(
        self, store: ObjectStore, selector: Selector, query: dict[str, str], kind: str
    ) -> None:
        handler: Any = self
        fake = handler.fake
        ctl: WatchControls = fake.watch_controls
        timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
        raw_rv = query.get("resourceVersion", "")
        with store.cond:
            now = time.monotonic()
            state = WatchState(
                store=store,
                selector=selector,
                user_agent=handler.headers.get("User-Agent", ""),
                bookmarks=query.get("allowWatchBookmarks", "").lower() in ("true", "1"),
                deadline=None if timeout is None else now + timeout,
                cursor=store.resource_version,
                drop_gen=ctl.drop_gen,
                end_gen=ctl.end_gen,
                bookmark_gen=ctl.bookmark_gen,
            )
            state.schedule_bookmark(now, fake.bookmark_frequency)
            if raw_rv in ("", "0"):
                # No version: synthetic ADDED for the current state, then changes.
                state.pending = [("ADDED", o) for o in store.current_matching(selector)]
                state.start_rv = store.newest_object_rv
            else:
                if not raw_rv.isdigit():
                    message = (
                        f'resourceVersion: Invalid value: "{raw_rv}": strconv.ParseUint:'
                        f' parsing "{raw_rv}": invalid syntax'
                    )
                    handler._send_json(500, status_body(500, message, reason=""))
                    return
                state.cursor = int(raw_rv)
                state.start_rv = max(state.cursor, store.latest_change)
                if state.cursor < store.oldest_rv and fake.gone_mode == "http":
                    raise ExpiredError(
                        f"too old resource version: {state.cursor} ({store.oldest_rv})"
                    )
                # In "event" mode an expired cursor surfaces from events_after
                # as an ERROR event on the open stream.
            ctl.open_watches[kind] = ctl.open_watches.get(kind, 0) + 1
        try:
            self._stream(state)
        finally:
            with store.cond:
                ctl.open_watches[kind] -= 1

    def _stream(self, state: WatchState) -> None:
        handler: Any = self
        self._start_stream()
        try:
            while True:
                action, events = self._next_events(state)
                if action == "abort":
                    self._abort()
                    return
                for event in events:
                    self._chunk((json.dumps(event) + "\n").encode())
                if action == "end":
                    self._chunk(b"")
                    return
        except (BrokenPipeError, ConnectionResetError):
            # The client went away; nothing to tell it.
            handler.close_connection = True

    def _next_events(self, state: WatchState) -> tuple[str, list[dict[str, Any]]]:
        """Block until there is something to send: ("send"|"end", events) or "abort"."""
        handler: Any = self
        fake = handler.fake
        store, ctl = state.store, fake.watch_controls
        if state.pending:
            pending, state.pending = state.pending, []
            return "send", [state.event(t, o) for t, o in pending]
        with store.cond:
            while True:
                if ctl.stopping or ctl.drop_gen != state.drop_gen:
                    return "abort", []
                cut = fake.faults.cut_for(state.user_agent)
                if cut is not None and cut.hang_s is None:
                    return "abort", []
                if ctl.stalled or cut is not None:
                    store.cond.wait(0.05)
                    continue
                if ctl.end_gen != state.end_gen:
                    return "end", []
                try:
                    found, state.cursor = store.events_after(state.cursor, state.selector)
                except ExpiredError as err:
                    return "end", [{"type": "ERROR", "object": status_body(410, str(err))}]
                if found:
                    return "send", [state.event(t, o) for t, o in found]
                now = time.monotonic()
                if state.bookmarks and ctl.bookmark_gen != state.bookmark_gen:
                    state.bookmark_gen = ctl.bookmark_gen
                    return "send", [state.bookmark()]
                if state.next_bookmark is not None and now >= state.next_bookmark:
                    state.schedule_bookmark(now, fake.bookmark_frequency)
                    if store.latest_change > state.start_rv:
                        return "send", [state.bookmark()]
                    continue
                if state.deadline is not None and now >= state.deadline:
                    return "end", []
                wake = [t for t in (state.deadline, state.next_bookmark) if t is not None]
                remaining = min(wake, default=now + 0.05) - now
                store.cond.wait(max(0.001, min(0.05, remaining)))

    def _send_stream_error(self, status: dict[str, Any]) -> None:
        self._start_stream()
        self._chunk((json.dumps({"type": "ERROR", "object": status}) + "\n").encode())
        self._chunk(b"")

    def _start_stream(self) -> None:
        handler: Any = self
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()

    def _chunk(self, data: bytes) -> None:
        handler: Any = self
        handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        handler.wfile.flush()

    def _abort(self) -> None:
        """Cut the connection without finishing the response."""
        handler: Any = self
        handler.close_connection = True
        with contextlib.suppress(OSError):
            handler.connection.shutdown(socket.SHUT_RDWR)
