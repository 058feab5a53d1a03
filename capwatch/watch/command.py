"""``capwatch watch``: follow a node agent's (or a controller's) stream from a terminal or a script.

By default the per-GPU table (redrawn in place on a terminal, only what
changed elsewhere: see capwatch/watch/printer.py) and a line per disconnect
(again only when its reason changes), reconnect or resync; a terminal's table
is greyed while the stream is lost, redrawn every second. ``--json`` prints
each message as one JSON object per line instead (status lines then go to
stderr); ``--dra v1`` follows the DRA-shaped mirror (``NodeWatchResources``);
``--cluster`` follows a controller's ``ClusterHealthService``, one row per
node (capwatch/watch/cluster_table.py). Once connected it reconnects for
ever, resuming where it left off, until ``--count`` messages, Ctrl-C or
SIGTERM (exit 0). A server never reached (unless ``--retry``) or one that
refuses the request (bad argument, service not served) exits 1; a ``--gpu``
the agent does not have exits 2. The flags are capwatch/watch/settings.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, TextIO

import grpc

from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.client.retrying import RetryingClient
from capwatch.client.stream_events import Cycle, Disconnected, Snapshot
from capwatch.kit.clock import SystemClock
from capwatch.kit.errors import ConfigError
from capwatch.watch.printer import Printer
from capwatch.watch.settings import (
    WatchSettings,
    add_watch_arguments,
    client_for,
    cluster_client_for,
    watch_settings,
)

__all__ = [
    "WatchSettings",
    "add_watch_arguments",
    "client_for",
    "cluster_client_for",
    "run_watch",
    "watch",
    "watch_settings",
]

EXIT_OK, EXIT_FAILED = 0, 1
# While the stream is lost, a terminal's picture is redrawn this often (its ages move on).
LOST_REDRAW_S = 1.0
# Retrying cannot fix these: the server understood the request and refused it (an
# agent serving another node than --node's answers FAILED_PRECONDITION).
FATAL_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.FAILED_PRECONDITION,
    }
)
NOT_A_CONTROLLER = "is it a capwatch controller? --cluster follows its gRPC port, 50052"


def run_watch(
    settings: WatchSettings, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Watch until done; returns the exit code. Ctrl-C, SIGTERM and a closed pipe exit 0."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        return asyncio.run(watch(settings, out=out, err=err))
    except KeyboardInterrupt:
        return EXIT_OK
    except BrokenPipeError:
        # The reader went away (`| head`): exit quietly, and keep Python's
        # final flush of stdout from complaining about the pipe too.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        return EXIT_OK


async def watch(
    settings: WatchSettings,
    *,
    out: TextIO,
    err: TextIO,
    stop: asyncio.Event | None = None,
) -> int:
    """Print the stream until ``--count`` messages, ``stop``, or SIGINT/SIGTERM."""
    stop = stop or asyncio.Event()
    client, events = _subscribe(settings)
    printer = Printer(
        target=settings.target, json=settings.json, since=settings.since, out=out, err=err
    )
    async with client, _stopping_on_signals(stop):
        closer = asyncio.create_task(_close_when(stop, client), name="capwatch-watch-closer")
        ticker = asyncio.create_task(_redraw_while_lost(printer), name="capwatch-watch-redraw")
        seen = 0
        reached = False
        unchecked = bool(settings.indexes or settings.uuids)
        try:
            async with contextlib.aclosing(events) as stream:
                async for event in stream:
                    if isinstance(event, Disconnected):
                        if event.code in FATAL_CODES:
                            unimplemented = event.code is grpc.StatusCode.UNIMPLEMENTED
                            hint = NOT_A_CONTROLLER if settings.cluster and unimplemented else ""
                            printer.refused(event, hint=hint)
                            return EXIT_FAILED
                        if not reached and not settings.retry:
                            printer.unreachable(event)
                            return EXIT_FAILED
                        printer.disconnected(event)
                        continue
                    reached = True
                    if unchecked:
                        unchecked = not _check_gpus(settings, event)
                    printer.message(event)
                    seen += 1
                    if settings.count is not None and seen >= settings.count:
                        break
        finally:
            ticker.cancel()
            printer.close()
            closer.cancel()
            for task in (closer, ticker):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    return EXIT_OK


def _subscribe(settings: WatchSettings) -> tuple[RetryingClient, AsyncGenerator[Any, None]]:
    """The client ``settings`` ask for, and its events (not yet started)."""
    since, instance = settings.since, settings.instance
    if settings.cluster:
        cluster = cluster_client_for(settings)
        return cluster, cluster.events(since=since, instance_id=instance)
    client = client_for(settings)
    if settings.dra is not None:
        return client, client.dra_devices(settings.dra)
    return client, client.events(since=since, instance_id=instance)


def _check_gpus(settings: WatchSettings, event: object) -> bool:
    """Whether ``event`` shows which GPUs the agent has (a snapshot, or a cycle that
    reached every GPU); if so, every ``--gpu`` must be one of them (else ConfigError:
    the agent's filter would show an empty table for a typo, for ever)."""
    if isinstance(event, Snapshot):
        devices = event.snapshot.devices
    elif isinstance(event, Cycle) and _reached_every_gpu(event.cycle):
        devices = event.cycle.devices  # resumed with --since: cycles come first
    else:
        return False
    indexes = {device.index for device in devices}
    uuids = {device.uuid.lower() for device in devices}
    unknown = [str(i) for i in settings.indexes if i not in indexes]
    unknown += [u for u in settings.uuids if u.lower() not in uuids]
    if unknown:
        raise ConfigError("--gpu", f"{settings.target} has no GPU {', '.join(unknown)}")
    return True


def _reached_every_gpu(cycle: pb.CycleReport) -> bool:
    # An aborted cycle reached none; one cut short by a shutdown maybe not all.
    aborted = cycle.abort_reason not in (pb.ABORT_REASON_UNSPECIFIED, pb.ABORT_REASON_NONE)
    return not aborted and not cycle.interrupted


async def _redraw_while_lost(printer: Printer) -> None:
    """Between retries, the lost picture's time and ages move on (on the client's clock:
    the one its events' ``received_at`` are on)."""
    clock = SystemClock()
    while True:
        await asyncio.sleep(LOST_REDRAW_S)
        if printer.lost:
            printer.refresh(clock.monotonic())


async def _close_when(stop: asyncio.Event, client: RetryingClient) -> None:
    await stop.wait()
    await client.close()


@contextlib.asynccontextmanager
async def _stopping_on_signals(stop: asyncio.Event) -> AsyncIterator[None]:
    """SIGINT and SIGTERM set ``stop`` (only the main thread can take signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        yield
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
