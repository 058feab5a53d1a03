"""A Prometheus registry served at /metrics over HTTP, on the event loop.

The agent's (:mod:`capwatch.server.metrics.endpoint`) and the controller's metrics are
served by it. The endpoint is :mod:`capwatch.server.http.serving`'s one-path server,
the one the readiness shim serves its probe with: ``GET`` and ``HEAD /metrics`` (any query
ignored) get the registry in the format the ``Accept`` header asks for (text
or OpenMetrics), any other path 404, any other method 405. prometheus_client's
own server gave every connection a thread for as long as the client kept it
open, with no timeout or limit, and answered every path (1,122 idle
connections: 1,133 threads and 31 MiB). Here a connection is a coroutine with
a deadline for its request (5 s) and for its answer, at most 256 are waiting
for their request at once (the oldest is dropped to make room), and each
response closes its connection.

The registry is rendered in a worker thread, one render at a time, which
every scrape waiting meanwhile shares: a node's series take milliseconds to
render, and neither a scrape nor a flood of them may hold the loop that
serves the streams (a flood costs one thread's share of the interpreter).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from capwatch.server.http.serving import (
    HEAD_TIMEOUT_S,
    MAX_CONNECTIONS,
    PathServer,
    Request,
    Response,
)
from capwatch.server.listeners import ServeError

log = logging.getLogger(__name__)

PATH = "/metrics"


class ScrapeCollector(Collector):
    """Series computed at scrape time. :meth:`families` builds every family; empty for
    ``describe`` (registration learns the names), filled in for ``collect``."""

    def describe(self) -> Iterable[Metric]:
        return self.families(populated=False)

    def collect(self) -> Iterable[Metric]:
        return self.families(populated=True)

    def families(self, *, populated: bool) -> list[Metric]:
        raise NotImplementedError


def _listening_socket(address: str, port: int) -> socket.socket:
    """Bound and listening, as prometheus_client's server binds: the first address the
    name resolves to (``::`` dual-stack, as the system makes it); no SO_REUSEPORT."""
    family, kind, proto, _, sockaddr = socket.getaddrinfo(
        address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class RegistryServer:
    """``registry`` served on /metrics over HTTP on the event loop (any process's)."""

    def __init__(
        self,
        *,
        registry: CollectorRegistry,
        address: str,
        port: int,
        max_connections: int = MAX_CONNECTIONS,
        head_timeout_s: float = HEAD_TIMEOUT_S,
        flag: str = "--metrics-port",  # what a port that cannot be bound is blamed on
    ) -> None:
        self.registry = registry
        self._flag = flag
        self._address = address
        self._port = port  # 0: any free port (tests); the command line maps 0 to "off"
        self.http = PathServer(
            {PATH: self._respond},
            host=address,
            port=port,
            max_connections=max_connections,
            head_timeout_s=head_timeout_s,
            parse_headers=True,  # Accept chooses the format
        )
        # By format (text, OpenMetrics): the render in progress, shared by its waiters.
        self._rendering: dict[Callable[[CollectorRegistry], bytes], asyncio.Future[bytes]] = {}

    @property
    def port(self) -> int:
        """The bound port (0 resolved); only after :meth:`start`."""
        return self.http.port

    @property
    def address(self) -> str:
        host = f"[{self._address}]" if ":" in self._address else self._address
        return f"{host}:{self.port}"

    async def start(self) -> None:
        """Bind and serve. Raises ServeError."""
        try:
            # Binding looks the host up (getaddrinfo): keep it off the loop.
            sock = await asyncio.to_thread(_listening_socket, self._address, self._port)
        except OSError as exc:
            shown = f"[{self._address}]" if ":" in self._address else self._address
            reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
            raise ServeError(
                f"{self._flag}: cannot serve metrics on {shown}:{self._port}: {reason}"
            ) from exc
        await self.http.start(sock=sock)
        log.info("metrics serving address=%s path=%s", self.address, PATH)

    async def stop(self) -> None:
        await self.http.stop()

    async def _respond(self, request: Request) -> Response:
        encode, content_type = choose_encoder(request.header("accept"))
        return Response(status=200, body=await self._render(encode), content_type=content_type)

    async def _render(self, encode: Callable[[CollectorRegistry], bytes]) -> bytes:
        rendering = self._rendering.get(encode)
        if rendering is None:
            rendering = asyncio.ensure_future(asyncio.to_thread(encode, self.registry))
            self._rendering[encode] = rendering
            rendering.add_done_callback(lambda _: self._rendering.pop(encode, None))
        # Shielded: a scraper that hangs up does not cancel the others' render.
        return await asyncio.shield(rendering)
