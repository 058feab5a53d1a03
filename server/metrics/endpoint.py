"""The agent's metrics endpoint: /metrics on its event loop, and the task feeding it.

Started after the gRPC server binds and stopped last, so Prometheus can still
scrape while caps are restored. A port that cannot be bound fails the start.
Served by :class:`capwatch.server.http.exposition.RegistryServer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from capwatch.kit.supervision import ended
from capwatch.server.http.exposition import RegistryServer
from capwatch.server.http.serving import HEAD_TIMEOUT_S, MAX_CONNECTIONS, PathServer
from capwatch.server.metrics.cycle_metrics import Metrics

log = logging.getLogger(__name__)

TASK_NAME = "capwatch-metrics"


class MetricsServer:
    """The agent's /metrics, and the task that keeps its registry current."""

    def __init__(
        self,
        *,
        metrics: Metrics,
        address: str,
        port: int,
        on_fatal: Callable[[], None] = lambda: None,
        max_connections: int = MAX_CONNECTIONS,
        head_timeout_s: float = HEAD_TIMEOUT_S,
    ) -> None:
        self.metrics = metrics
        self._on_fatal = on_fatal
        self.endpoint = RegistryServer(
            registry=metrics.registry,
            address=address,
            port=port,
            max_connections=max_connections,
            head_timeout_s=head_timeout_s,
        )
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def http(self) -> PathServer:
        return self.endpoint.http

    @property
    def port(self) -> int:
        """The bound port (0 resolved); only after :meth:`start`."""
        return self.endpoint.port

    @property
    def address(self) -> str:
        return self.endpoint.address

    async def start(self) -> None:
        """Bind and serve, then start following the hub. Raises ServeError."""
        await self.endpoint.start()
        self._task = asyncio.create_task(self.metrics.follow(), name=TASK_NAME)
        self._task.add_done_callback(self._supervise)

    async def stop(self) -> None:
        """Stop following and serving; safe to call once, after a successful start."""
        self._stopping = True
        if self._task is not None and not self._task.done():  # a dead one was logged already
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.endpoint.stop()
        log.info("metrics stopped")

    def _supervise(self, task: asyncio.Task[None]) -> None:
        # The task ends by itself only when the hub releases its readers (the
        # server is stopping): that is not a failure; anything else is.
        ended(
            task,
            stopping=self._stopping,
            on_fatal=self._on_fatal,
            log=log,
            expected=lambda: self.metrics.publication.hub.readers_released,
        )
