"""A tiny HTTP/1.1 server for ``GET /readyz``, built to never starve the kubelet's probe.

Only what a probe needs: ``GET``/``HEAD /readyz`` answers 200 or 503 with a
short text body; any other path is 404, any other method 405; every response
closes the connection. No access log: a probe every 10 s would write ~8,600
lines a day per node.

Slow or abusive clients cannot crowd a probe out: each connection has a
deadline to send its request head (and a size limit), and when the connection
limit is reached the oldest connection still sending its head is dropped to
make room, so a new connection is always served.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

PATH = "/readyz"
HEAD_LIMIT = 8 * 1024
HEAD_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 5.0
# Connections still sending their head, at most. Well above what can be pending
# at once legitimately: clients accepted in one loop turn all count until the
# loop gets to read them, and at 64, 100 concurrent clients evicted each other
# (bench/readyz.py). Squatters are evicted whatever the limit.
MAX_CONNECTIONS = 256

_REASONS = {
    200: "OK",
    404: "Not Found",
    405: "Method Not Allowed",
    400: "Bad Request",
    503: "Service Unavailable",
}


@dataclass(frozen=True, kw_only=True)
class Answer:
    status: int  # 200 or 503
    body: str


class ReadyzServer:
    """Serves ``answer()`` on ``/readyz``. ``start`` raises OSError if the port is taken."""

    def __init__(
        self,
        answer: Callable[[], Answer],
        *,
        host: str = "0.0.0.0",  # noqa: S104 - the kubelet probes the pod IP
        port: int = 8081,
        max_connections: int = MAX_CONNECTIONS,
        head_timeout_s: float = HEAD_TIMEOUT_S,
        extra_routes: Mapping[str, Callable[[], Answer]] | None = None,
    ) -> None:
        """``extra_routes``: more paths answered the same way (the controller's
        ``/healthz`` beside its ``/readyz``)."""
        self._routes = {PATH: answer, **(extra_routes or {})}
        self._host, self._port = host, port
        self._max = max_connections
        self._head_timeout_s = head_timeout_s
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

    async def start(self) -> None:
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
            await self._respond(writer, 400, "request head too large\n", body=True)
            return
        self._reading.pop(writer, None)
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await self._respond(writer, 400, "bad request\n", body=True)
            return
        method, target = parts[0], parts[1].split("?", 1)[0]
        route = self._routes.get(target)
        if route is None:
            await self._respond(writer, 404, "not found\n", body=method != "HEAD")
        elif method not in ("GET", "HEAD"):
            await self._respond(writer, 405, "method not allowed\n", body=True, allow=True)
        else:
            answer = route()
            await self._respond(writer, answer.status, answer.body, body=method == "GET")

    @staticmethod
    async def _respond(
        writer: asyncio.StreamWriter, status: int, text: str, *, body: bool, allow: bool = False
    ) -> None:
        payload = text.encode()
        headers = [
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}",
            "Content-Type: text/plain; charset=utf-8",
            f"Content-Length: {len(payload)}",
            "Cache-Control: no-store",
            "Connection: close",
        ]
        if allow:
            headers.append("Allow: GET, HEAD")
        writer.write(("\r\n".join(headers) + "\r\n\r\n").encode() + (payload if body else b""))
        async with asyncio.timeout(WRITE_TIMEOUT_S):
            await writer.drain()
