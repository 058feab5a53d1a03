"""``capwatch shim``: the kubelet's readiness probe, fed by the agent's stream.

A separate, unprivileged process in the agent's pod. It subscribes to the
agent's capwatch.v1 stream over the shared unix socket with the project's
client library, and answers ``GET /readyz`` on port 8081: 200 while the
readiness rule holds, 503 otherwise, with the reason and the last good
cycle's age in a one-line body. It fails closed: from the moment the stream
is lost until a fresh good cycle arrives, the answer is 503 ``stream-lost``.
On the unix socket the client retries at least once per agent interval (and
once a second; :mod:`capwatch.kit.backoff`), so after an agent outage the answer is
200 again within about one interval of the agent's return. A port that cannot
be bound is fatal at start.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass

from capwatch.client.connection import CONNECTION_OPTIONS, Connection, connection
from capwatch.client.node_health import NodeHealthClient
from capwatch.client.stream_events import Cycle, Disconnected, Heartbeat, Snapshot
from capwatch.client.stream_readiness import StreamReadiness
from capwatch.kit.addresses import listen_address, listen_port
from capwatch.kit.clock import Clock, SystemClock
from capwatch.kit.errors import CapwatchError
from capwatch.kit.flags import (
    LOG_FORMAT_OPTION,
    LogFormat,
    Option,
    add_options,
    log_level_option,
    read_options,
)
from capwatch.logs import configure_logging
from capwatch.server.http.readyz import Answer, ReadyzServer

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED = 0, 1


class ShimError(CapwatchError):
    """The shim cannot start (its port is taken)."""


DEFAULT_PORT = 8081


_OPTIONS = (
    Option(
        flag="--readyz-port",
        env="CAPWATCH_READYZ_PORT",
        default=str(DEFAULT_PORT),
        convert=listen_port,
        help="port serving GET /readyz (the chart pins 8081)",
    ),
    Option(
        flag="--readyz-address",
        env="CAPWATCH_READYZ_ADDRESS",
        default="0.0.0.0",  # noqa: S104 - the kubelet probes the pod IP
        convert=listen_address,
        help="address serving GET /readyz",
    ),
    LOG_FORMAT_OPTION,
    log_level_option("info"),
)


@dataclass(frozen=True, kw_only=True)
class ShimSettings:
    connection: Connection  # the agent to follow: as `capwatch watch` reaches it
    readyz_address: str
    readyz_port: int
    log_format: LogFormat = LogFormat.TEXT
    log_level: str = "INFO"


def add_shim_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser, (*CONNECTION_OPTIONS, *_OPTIONS))


def shim_settings(namespace: argparse.Namespace, environ: Mapping[str, str]) -> ShimSettings:
    values = read_options(namespace, environ, (*CONNECTION_OPTIONS, *_OPTIONS))
    return ShimSettings(
        connection=connection(values),
        readyz_address=values["readyz_address"],
        readyz_port=values["readyz_port"],
        log_format=values["log_format"],
        log_level=values["log_level"],
    )


def answer(readiness: StreamReadiness, now: float) -> Answer:
    """The probe's answer: status code and a one-line body with reason and age."""
    result = readiness.evaluate(now)
    age = "never" if result.last_good_age_s is None else f"{result.last_good_age_s:.1f}s ago"
    if result.ready:
        return Answer(status=200, body=f"ok: last good cycle {age}\n")
    return Answer(status=503, body=f"not ready: {result.text}; last good cycle {age}\n")


class Shim:
    """The stream consumer and the HTTP endpoint, sharing one StreamReadiness."""

    def __init__(
        self, *, client: NodeHealthClient, settings: ShimSettings, clock: Clock | None = None
    ) -> None:
        self._client = client
        self._clock = clock or SystemClock()
        self.readiness = StreamReadiness()
        self.http = ReadyzServer(
            lambda: answer(self.readiness, self._clock.monotonic()),
            host=settings.readyz_address,
            port=settings.readyz_port,
        )

    async def follow(self) -> None:
        """Fold the stream into readiness until cancelled; reconnects are the client's."""
        async for event in self._client.events():
            if isinstance(event, Snapshot):
                self.readiness.on_snapshot(event.snapshot, received_at=event.received_at)
            elif isinstance(event, Cycle):
                self.readiness.on_cycle(event.cycle, received_at=event.received_at)
            elif isinstance(event, Heartbeat):
                self.readiness.on_heartbeat(event.heartbeat, received_at=event.received_at)
            elif isinstance(event, Disconnected):
                if not self.readiness.lost:
                    log.warning("stream lost, failing closed: %s", event.error)
                self.readiness.on_lost()


async def run_shim(client: NodeHealthClient, settings: ShimSettings) -> int:
    shim = Shim(client=client, settings=settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await shim.http.start()
    except OSError as exc:
        # Like the agent's ports: exit 1 ("cannot start"), not a configuration error.
        raise ShimError(
            f"--readyz-port: cannot serve /readyz on "
            f"{settings.readyz_address}:{settings.readyz_port}: {_reason(exc)}"
        ) from exc
    log.info(
        "serving /readyz address=%s port=%d target=%s",
        settings.readyz_address,
        shim.http.port,
        client.target,
    )
    follower = asyncio.create_task(shim.follow(), name="capwatch-shim-stream")
    follower.add_done_callback(lambda _: stop.set())  # supervised: its end ends the shim
    await stop.wait()
    died = follower.done() and not follower.cancelled() and follower.exception() is not None
    if died:
        log.error("stream consumer died", exc_info=follower.exception())
    follower.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await follower
    await shim.http.stop()
    await client.close()
    return EXIT_FAILED if died else EXIT_OK


def _reason(exc: OSError) -> str:
    # asyncio's bind error embeds the address as a Python tuple; the errno says it plainly.
    return os.strerror(exc.errno).lower() if exc.errno else str(exc)


def main_shim(namespace: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """``capwatch shim``: validate everything, then serve until SIGTERM."""
    settings = shim_settings(namespace, environ)
    client = NodeHealthClient(**settings.connection.arguments())
    configure_logging(settings.log_level, settings.log_format)
    return asyncio.run(run_shim(client, settings))
