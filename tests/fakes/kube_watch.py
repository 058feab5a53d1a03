"""The fake API server's watch streams: ``GET .../pods?watch=true``.

A mixin for the fake's request handler. A watch is a chunked stream of
newline-delimited events after ``resourceVersion`` (ADDED, MODIFIED, DELETED,
ERROR), ending cleanly after ``timeoutSeconds``. With ``allowWatchBookmarks``
it also carries BOOKMARKs as the real watch cache sends them: every
``bookmark_frequency`` seconds (a minute by default) and once 2 s before the
watch's deadline, plus any a test asks for. The test controls reach every open
stream: drop (no terminating chunk), end (cleanly), stall (the connection stays
open and nothing is sent, not even the end, until unstalled).
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.kube_store import (
    ExpiredError,
    FieldSelector,
    Pod,
    SelectorError,
    bookmark_object,
    status_body,
    watch_object,
)

# The real watch cache's bookmark before a watch's deadline (cacher.go).
PRETIMEOUT_BOOKMARK_S = 2.0


@dataclass(kw_only=True)
class WatchState:
    """One open watch: where it is in the history and which controls it has seen."""

    selector: FieldSelector
    bookmarks: bool
    deadline: float | None
    cursor: int
    drop_gen: int
    end_gen: int
    bookmark_gen: int
    next_bookmark: float | None = None
    pending: list[tuple[str, Pod]] = field(default_factory=list)

    def schedule_bookmark(self, now: float, frequency: float) -> None:
        """The real cacher's rule: every ``frequency``, and 2 s before the deadline."""
        if not self.bookmarks:
            self.next_bookmark = None
            return
        when = now + frequency
        if self.deadline is not None:
            when = min(when, self.deadline - PRETIMEOUT_BOOKMARK_S)
        self.next_bookmark = when if when > now else None


class WatchEndpoint:
    """Mixed into the handler, which supplies ``fake``, ``wfile``, ``connection``,
    ``send_response``/``send_header``/``end_headers`` and ``close_connection``."""

    def _watch(self, selector: FieldSelector, query: dict[str, str]) -> None:
        handler: Any = self
        fake = handler.fake
        store, ctl = fake.store, fake._ctl
        timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
        raw_rv = query.get("resourceVersion", "")
        with store.cond:
            now = time.monotonic()
            state = WatchState(
                selector=selector,
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
                state.pending = [("ADDED", p) for p in store.current_matching(selector)]
            else:
                try:
                    state.cursor = int(raw_rv)
                except ValueError as err:
                    raise SelectorError(f"invalid resourceVersion: {raw_rv!r}") from err
                if state.cursor < store.oldest_rv and fake.gone_mode == "http":
                    raise ExpiredError(
                        f"too old resource version: {state.cursor} ({store.oldest_rv})"
                    )
                # In "event" mode an expired cursor surfaces from events_after
                # as an ERROR event on the open stream.
            ctl.open_watches += 1
        try:
            self._stream(state)
        finally:
            with store.cond:
                ctl.open_watches -= 1

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
        store, ctl = fake.store, fake._ctl
        if state.pending:
            pending, state.pending = state.pending, []
            return "send", [{"type": t, "object": watch_object(o)} for t, o in pending]
        with store.cond:
            while True:
                if ctl.stopping or ctl.drop_gen != state.drop_gen:
                    return "abort", []
                if ctl.stalled:
                    store.cond.wait(0.05)
                    continue
                if ctl.end_gen != state.end_gen:
                    return "end", []
                try:
                    found, state.cursor = store.events_after(state.cursor, state.selector)
                except ExpiredError as err:
                    return "end", [{"type": "ERROR", "object": status_body(410, str(err))}]
                if found:
                    return "send", [{"type": t, "object": watch_object(o)} for t, o in found]
                now = time.monotonic()
                if state.bookmarks and ctl.bookmark_gen != state.bookmark_gen:
                    state.bookmark_gen = ctl.bookmark_gen
                    return "send", [{"type": "BOOKMARK", "object": bookmark_object(state.cursor)}]
                if state.next_bookmark is not None and now >= state.next_bookmark:
                    state.schedule_bookmark(now, fake.bookmark_frequency)
                    return "send", [{"type": "BOOKMARK", "object": bookmark_object(state.cursor)}]
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
