"""An in-memory collection behind the informer's ListWatchRequests, as urllib3 responses.

LIST answers every object with the collection's resourceVersion; WATCH replays the events
after the requested resourceVersion and then streams new ones, newline-delimited as the
API server sends them, until the informer cuts it. :meth:`MemoryCollection.expire`
answers the next watch with a 410 Gone ERROR event (the informer relists), and
``silently`` changes the objects without an event (what a compacted history loses).
"""

from __future__ import annotations

import copy
import io
import json
import queue
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import urllib3


class _WatchStream:
    """What the informer uses of a streamed urllib3 response."""

    def __init__(self) -> None:
        self._lines: queue.Queue[bytes | None] = queue.Queue()

    def push(self, line: bytes) -> None:
        self._lines.put(line)

    def stream(self, amt: int | None = None, decode_content: bool = False) -> Iterator[bytes]:
        while True:
            line = self._lines.get()
            if line is None:
                return
            yield line

    def shutdown(self) -> None:
        self._lines.put(None)

    def close(self) -> None:
        self._lines.put(None)

    def release_conn(self) -> None:
        pass


class MemoryCollection:
    def __init__(self, objects: Iterable[Mapping[str, Any]] = ()) -> None:
        self._lock = threading.Lock()
        self._version = 1
        self._objects: dict[str, dict[str, Any]] = {}
        self._history: list[tuple[int, bytes]] = []
        self._watches: list[_WatchStream] = []
        self._expire_next = False
        for obj in objects:
            self.silently(obj)

    # --- the test's side ---------------------------------------------------------------

    def silently(self, obj: Mapping[str, Any], *, delete: bool = False) -> None:
        """Change the collection without a watch event."""
        with self._lock:
            key = obj["metadata"]["uid"]
            if delete:
                self._objects.pop(key, None)
            else:
                self._version += 1
                stored = copy.deepcopy(dict(obj))
                stored["metadata"]["resourceVersion"] = str(self._version)
                self._objects[key] = stored

    def emit(self, kind: str, obj: Mapping[str, Any]) -> None:
        """ADDED, MODIFIED or DELETED ``obj``, to the objects and every watch."""
        with self._lock:
            self._version += 1
            stored = copy.deepcopy(dict(obj))
            stored["metadata"]["resourceVersion"] = str(self._version)
            key = stored["metadata"]["uid"]
            if kind == "DELETED":
                self._objects.pop(key, None)
            else:
                self._objects[key] = stored
            line = json.dumps({"type": kind, "object": stored}).encode() + b"\n"
            self._history.append((self._version, line))
            for watch in self._watches:
                watch.push(line)

    def expire(self) -> None:
        """The next watch (and the open ones) end with 410 Gone: the informer relists."""
        gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
        with self._lock:
            self._expire_next = True
            self._history.clear()
            for watch in self._watches:
                watch.push(json.dumps(gone).encode() + b"\n")

    @property
    def watching(self) -> int:
        with self._lock:
            return len(self._watches)

    # --- ListWatchRequests -------------------------------------------------------------

    def list(self, *, limit: int, continue_token: str, timeout: float) -> urllib3.HTTPResponse:
        with self._lock:
            self._expire_next = False
            body = {
                "kind": "List",
                "metadata": {"resourceVersion": str(self._version)},
                "items": list(self._objects.values()),
            }
        return urllib3.HTTPResponse(body=io.BytesIO(json.dumps(body).encode()), status=200)

    def watch(
        self,
        *,
        resource_version: str,
        timeout_seconds: int,
        connect_timeout: float,
        read_timeout: float,
    ) -> urllib3.HTTPResponse:
        stream = _WatchStream()
        with self._lock:
            if self._expire_next:
                gone = {"type": "ERROR", "object": {"code": 410, "reason": "Expired"}}
                stream.push(json.dumps(gone).encode() + b"\n")
            else:
                since = int(resource_version or 0)
                for version, line in self._history:
                    if version > since:
                        stream.push(line)
            self._watches.append(stream)
        return stream  # type: ignore[return-value]  # duck-typed: what the informer uses
