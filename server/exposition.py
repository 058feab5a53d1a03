"""The metrics endpoint: /metrics over HTTP on its own thread, and the task feeding it.

Started after the gRPC server binds and stopped last, so Prometheus can still
scrape while caps are restored. A port that cannot be bound fails the start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from server.metrics import Metrics
from server.serving import ServeError

log = logging.getLogger(__name__)

TASK_NAME = "capwatch-metrics"
SHUTDOWN_POLL_S = 0.05  # how often the HTTP thread checks for a stop request


class _QuietHandler(WSGIRequestHandler):
    """No access log: Prometheus scrapes every few seconds, forever."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _HttpServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a stuck scraper must not hold the process at exit
    # An address in use must fail the start, not be shared with another process.
    allow_reuse_port = False


def _serve(
    registry: CollectorRegistry, address: str, port: int
) -> tuple[WSGIServer, threading.Thread]:
    """prometheus_client's start_http_server, with a quick shutdown and a named thread."""
    family, _, _, _, sockaddr = socket.getaddrinfo(
        address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]

    class Server(_HttpServer):
        address_family = family

    httpd = make_server(
        str(sockaddr[0]), port, make_wsgi_app(registry), Server, handler_class=_QuietHandler
    )
    thread = threading.Thread(
        target=httpd.serve_forever,
        kwargs={"poll_interval": SHUTDOWN_POLL_S},
        name="capwatch-metrics-http",
        daemon=True,
    )
    thread.start()
    return httpd, thread


class MetricsServer:
    """/metrics over HTTP on its own thread, and the task that keeps the registry current."""

    def __init__(
        self,
        *,
        metrics: Metrics,
        address: str,
        port: int,
        on_fatal: Callable[[], None] = lambda: None,
    ) -> None:
        self.metrics = metrics
        self._address = address
        self._port = port  # 0: any free port (tests); the command line maps 0 to "off"
        self._on_fatal = on_fatal
        self._httpd: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def port(self) -> int:
        """The bound port (0 resolved); only after :meth:`start`."""
        assert self._httpd is not None
        return int(self._httpd.server_port)

    @property
    def address(self) -> str:
        host = f"[{self._address}]" if ":" in self._address else self._address
        return f"{host}:{self.port}"

    async def start(self) -> None:
        """Bind and serve, then start following the hub. Raises ServeError."""
        try:
            # Binding looks the host up (getaddrinfo, getfqdn): keep it off the loop.
            self._httpd, self._thread = await asyncio.to_thread(
                _serve, self.metrics.registry, self._address, self._port
            )
        except OSError as exc:
            shown = f"[{self._address}]" if ":" in self._address else self._address
            reason = exc.strerror or str(exc)
            raise ServeError(f"cannot serve metrics on {shown}:{self._port}: {reason}") from exc
        self._task = asyncio.create_task(self.metrics.follow(), name=TASK_NAME)
        self._task.add_done_callback(self._supervise)
        log.info("metrics serving address=%s path=/metrics", self.address)

    async def stop(self) -> None:
        """Stop following and serving; safe to call once, after a successful start."""
        self._stopping = True
        if self._task is not None and not self._task.done():  # a dead one was logged already
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._httpd is not None:
            await asyncio.to_thread(self._shutdown, self._httpd)
        log.info("metrics stopped")

    def _shutdown(self, httpd: WSGIServer) -> None:
        httpd.shutdown()  # waits for serve_forever's next poll
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _supervise(self, task: asyncio.Task[None]) -> None:
        # The task ends by itself only when the hub releases its readers (the
        # server is stopping): that is not a failure; anything else is.
        if task.cancelled() or self._stopping:
            return
        exc = task.exception()
        if exc is None and self.metrics.publication.hub.readers_released:
            return
        log.error("task %s ended unexpectedly; stopping", task.get_name(), exc_info=exc)
        self._on_fatal()
