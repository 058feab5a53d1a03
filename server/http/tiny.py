"""A tiny HTTP/1.1 server for a few fixed paths, on the event loop, that no client can starve.

Only what a probe or a scrape needs: ``GET``/``HEAD`` on each path is
answered by its coroutine; any other path is 404, any other method 405; every
response closes the connection. No access log: a probe every 10 s would write
~8,600 lines a day per node.

Slow or abusive clients cannot crowd anyone out, nor cost a thread each:
connections are coroutines on the loop; each has a deadline to send its
request head (and a size limit) and to take its answer; and when the
connection limit is reached, the oldest connection still sending its head is
dropped to make room, so a new connection is always served.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

HEAD_LIMIT = 8 * 1024
HEAD_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 5.0
# Connections still sending their head, at most. Well above what can be pending
# at once legitimately: clients accepted in one loop turn all count until the
# loop gets to read them, and at 64, 100 concurrent clients evicted each other
# (bench/readyz.py). Squatters are evicted whatever the limit.
MAX_CONNECTIONS = 256
TEXT = "text/plain; charset=utf-8"

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


@dataclass(frozen=True, kw_only=True)
class Request:
    method: str  # GET or HEAD: nothing else reaches the callback
    headers: Mapping[str, str] = field(default_factory=dict)  # names lower-cased

    def header(self, name: str) -> str:
        return self.headers.get(name.lower(), "")


@dataclass(frozen=True, kw_only=True)
class Response:
    status: int
    body: bytes
    content_type: str = TEXT


Respond = Callable[[Request], Awaitable[Response]]


class PathServer:
    """Serves ``await routes[path](request)`` on each path. ``start`` raises OSError if the
    port is taken."""

    def __init__(
        self,
        routes: Mapping[str, Respond],
        *,
        host: str,
        port: int,
        max_connections: int = MAX_CONNECTIONS,
        head_timeout_s: float = HEAD_TIMEOUT_S,
        parse_headers: bool = False,  # a probe's answer needs none of them
    ) -> None:
        self._routes = dict(routes)
        self._host, self._port = host, port
        self._max = max_connections
        self._head_timeout_s = head_timeout_s
        self._parse_headers = parse_headers
        self._server: asyncio.Server | None = None
        # Connections still sending their request head, oldest first.
        self._reading: dict[asyncio.StreamWriter, None] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.evicted = 0

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def connections(self) -> int:
        """Open connections (sending their head, or taking their answer)."""
        return len(self._tasks)

    @property
    def reading(self) -> int:
        """Open connections still sending their request head."""
        return len(self._reading)

    async def start(self, sock: socket.socket | None = None) -> None:
        """Listen on host and port, or on ``sock`` (bound and listening) when given."""
        if sock is not None:
            self._server = await asyncio.start_server(self._accept, sock=sock, limit=HEAD_LIMIT)
            return
        # No SO_REUSEPORT: a port in use must fail the start.
        self._server = await asyncio.start_server(
            self._accept, self._host, self._port, limit=HEAD_LIMIT, reuse_address=True
        )

    async def stop(self) -> None:
        """Stop accepting, end every open connection, and wait for their handlers."""
        if self._server is None:
            return
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=WRITE_TIMEOUT_S)
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._handle(reader, writer)
        except asyncio.CancelledError:
            writer.close()  # stopping: the peer sees the connection end, nothing is logged
        finally:
            self._tasks.discard(task)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._reading) >= self._max:
            oldest = next(iter(self._reading))
            self._reading.pop(oldest, None)
            oldest.close()
            self.evicted += 1
        self._reading[writer] = None
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            self._reading.pop(writer, None)
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError, OSError):
                async with asyncio.timeout(WRITE_TIMEOUT_S):
                    await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(self._head_timeout_s):
                head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            await _send(writer, Response(status=400, body=b"request head too large\n"))
            return
        self._reading.pop(writer, None)
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await _send(writer, Response(status=400, body=b"bad request\n"))
            return
        method, target = parts[0], parts[1].split("?", 1)[0]
        respond = self._routes.get(target)
        if respond is None:
            await _send(writer, Response(status=404, body=b"not found\n"), body=method != "HEAD")
        elif method not in ("GET", "HEAD"):
            response = Response(status=405, body=b"method not allowed\n")
            await _send(writer, response, allow=True)
        else:
            headers = _headers(lines[1:]) if self._parse_headers else {}
            try:
                response = await respond(Request(method=method, headers=headers))
            except Exception:  # a bug in the callback: a 500, not a dead connection handler
                log.exception("answering %s %s failed", method, target)
                response = Response(status=500, body=b"internal error\n")
            await _send(writer, response, body=method == "GET")


def _headers(lines: list[str]) -> dict[str, str]:
    headers = {}
    for line in lines:
        name, colon, value = line.partition(":")
        if colon:
            headers[name.strip().lower()] = value.strip()
    return headers


async def _send(
    writer: asyncio.StreamWriter, response: Response, *, body: bool = True, allow: bool = False
) -> None:
    head = [
        f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Unknown')}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
        "Cache-Control: no-store",
        "Connection: close",
    ]
    if allow:
        head.append("Allow: GET, HEAD")
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + (response.body if body else b""))
    async with asyncio.timeout(WRITE_TIMEOUT_S):
        await writer.drain()
