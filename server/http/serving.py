"""The HTTP edge: a few fixed paths served on the event loop, that no client can starve.

Only what a probe or a scrape needs: ``GET``/``HEAD`` on each path is
answered by its coroutine; any other path is 404, any other method 405; every
response closes the connection. No access log: a probe every 10 s would write
~8,600 lines a day per node.

A request's head is parsed by httptools (MagicStack's binding of llhttp, the
parser of Node.js, under uvicorn): capwatch has no HTTP parser of its own.
The loop around it stays on asyncio streams, which find the head's end within
its size limit; answers are the few fixed lines written here. aiohttp and h11
were measured too (bench/README.md, ``scenarios/http_edge.py``): aiohttp adds
11 MiB to every process that serves, which the controller at 5,000 nodes has
not got to spare, and h11, pure Python, costs 1.5x httptools' CPU a request.

Slow or abusive clients cannot crowd anyone out, nor cost a thread each:
connections are coroutines on the loop; each has a deadline to send its
request head, counted from its connect, and a size limit for the whole head;
a deadline to take its answer; and when the connection limit is reached, the
oldest connection still sending its head is dropped to make room, so a new
connection is always served.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus

import httptools

log = logging.getLogger(__name__)

HEAD_LIMIT = 8 * 1024
HEAD_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 5.0
# Connections still sending their head, at most. Well above what can be pending
# at once legitimately: clients accepted in one loop turn all count until the
# loop gets to read them, and at 64, 100 concurrent clients evicted each other
# (bench/scenarios/readyz.py). Squatters are evicted whatever the limit.
MAX_CONNECTIONS = 256
TEXT = "text/plain; charset=utf-8"
_REASONS = {status.value: status.phrase for status in HTTPStatus}


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

_TOO_LARGE = Response(status=400, body=b"request head too large\n")
_BAD = Response(status=400, body=b"bad request\n")


class _BadRequest(Exception):
    """The request head is not one HTTP/1.0 or 1.1 request."""


@dataclass(frozen=True, kw_only=True)
class _Head:
    method: str
    target: str
    headers: Mapping[str, str]


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
        write_timeout_s: float = WRITE_TIMEOUT_S,
        parse_headers: bool = False,  # a probe's answer needs none of them
    ) -> None:
        self._routes = dict(routes)
        self._host, self._port = host, port
        self._max = max_connections
        self._head_timeout_s = head_timeout_s
        self._write_timeout_s = write_timeout_s
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
            await asyncio.wait(self._tasks, timeout=self._write_timeout_s)
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._handle(reader, writer)
        except asyncio.CancelledError:
            writer.transport.abort()  # stopping: the peer sees the end, nothing is logged
        finally:
            self._tasks.discard(task)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._reading) >= self._max:
            oldest = next(iter(self._reading))
            self._reading.pop(oldest, None)
            oldest.transport.abort()
            self.evicted += 1
        self._reading[writer] = None
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            writer.transport.abort()  # a head or an answer past its deadline, or a reset
        finally:
            self._reading.pop(writer, None)
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError, OSError):
                async with asyncio.timeout(self._write_timeout_s):
                    await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(self._head_timeout_s):
                raw = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            await self._send(writer, _TOO_LARGE, body=True)
            return
        self._reading.pop(writer, None)
        try:
            head = _parse(raw)
        except _BadRequest:
            await self._send(writer, _BAD, body=True)
            return
        respond = self._routes.get(head.target)
        if respond is None:
            response = Response(status=404, body=b"not found\n")
        elif head.method not in ("GET", "HEAD"):
            response = Response(status=405, body=b"method not allowed\n")
        else:
            headers = head.headers if self._parse_headers else {}
            try:
                response = await respond(Request(method=head.method, headers=headers))
            except Exception:  # a bug in the callback: a 500, not a dead connection handler
                log.exception("answering %s %s failed", head.method, head.target)
                response = Response(status=500, body=b"internal error\n")
        await self._send(writer, response, body=head.method != "HEAD")

    async def _send(self, writer: asyncio.StreamWriter, response: Response, *, body: bool) -> None:
        lines = [
            f"HTTP/1.1 {response.status} {_REASONS.get(response.status, '')}",
            f"Content-Type: {response.content_type}",
            f"Content-Length: {len(response.body)}",
            "Cache-Control: no-store",
            "Connection: close",
        ]
        if response.status == 405:
            lines.append("Allow: GET, HEAD")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + (response.body if body else b""))
        async with asyncio.timeout(self._write_timeout_s):
            await writer.drain()


class _Collector:
    """What httptools' parser calls back with, for one request head."""

    def __init__(self) -> None:
        self.url = b""
        self.headers: dict[str, str] = {}
        self.complete = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.complete = True


def _parse(raw: bytes) -> _Head:
    """One request head, whole (it ends with its blank line), as httptools reads it. A
    request line or header it refuses, a version other than 1.0 and 1.1, or an HTTP/1.1
    request without Host (RFC 9112: answered 400) is a :class:`_BadRequest`."""
    collected = _Collector()
    parser = httptools.HttpRequestParser(collected)
    try:
        parser.feed_data(raw)
    except httptools.HttpParserUpgrade:
        pass  # an Upgrade asked for is not given: the request is answered as it is
    except httptools.HttpParserError as err:
        raise _BadRequest(str(err)) from err
    version = parser.get_http_version()
    if not collected.complete or version not in ("1.0", "1.1"):
        raise _BadRequest(f"HTTP/{version}")
    if version == "1.1" and "host" not in collected.headers:
        raise _BadRequest("HTTP/1.1 without Host")
    try:
        target = httptools.parse_url(collected.url).path.decode("ascii")
    except (httptools.HttpParserInvalidURLError, UnicodeDecodeError) as err:
        raise _BadRequest("request target") from err
    return _Head(
        method=parser.get_method().decode("ascii"), target=target, headers=collected.headers
    )
