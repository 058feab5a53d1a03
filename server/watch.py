"""``capwatch watch``: follow a node agent's stream from a terminal or a script.

By default a per-GPU table per cycle, a line per heartbeat and a line per
disconnect, reconnect or resync; ``--json`` prints each message as one JSON
object per line instead (status lines then go to stderr); ``--dra v1`` follows
the kubelet's view (``NodeWatchResources``). It reconnects for ever, resuming
where it left off, until ``--count`` messages, Ctrl-C or SIGTERM (exit 0).
An agent that rejects the request (bad argument, service not served) exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import sys
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import grpc
from google.protobuf.json_format import MessageToJson

from agent.errors import ConfigError
from agent.flags import Option, add_options, enum_choice, optional_path, read_options
from agent.settings import LOG_FORMAT_OPTION, LogFormat, log_level_option
from server.client import (
    Cycle,
    DeviceList,
    Disconnected,
    DraVersion,
    Heartbeat,
    NodeHealthClient,
    Snapshot,
)
from server.gen.capwatch.v1 import node_health_pb2 as pb
from server.limits import MAX_HEARTBEAT_S, MIN_HEARTBEAT_S
from server.settings import DEFAULT_SOCKET, host_port
from server.tables import render_cycle, render_devices, render_heartbeat, render_snapshot

EXIT_OK, EXIT_FAILED = 0, 1
DEFAULT_TARGET = f"unix://{DEFAULT_SOCKET}"
# Retrying cannot fix these: the agent understood the request and refused it.
FATAL_CODES = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNIMPLEMENTED})

_UUID = re.compile(r"[A-Za-z0-9][A-Za-z0-9\-]{0,127}")


@dataclass(frozen=True, kw_only=True)
class WatchSettings:
    target: str
    tls_ca: Path | None
    tls_cert: Path | None
    tls_key: Path | None
    tls_server_name: str | None
    json: bool
    dra: DraVersion | None  # None: capwatch.v1 Watch
    since: int
    heartbeat_s: float | None  # None: the agent's cycle interval
    count: int | None  # stop after this many messages; None: never
    indexes: tuple[int, ...]
    uuids: tuple[str, ...]
    log_level: str = "WARNING"  # the client's own log (reconnects: INFO)
    log_format: LogFormat = LogFormat.TEXT

    @property
    def tls(self) -> bool:
        return self.tls_ca is not None or self.tls_cert is not None


def _target(flag: str, text: str) -> str:
    if text.startswith("unix://"):
        if not text.removeprefix("unix://").startswith("/"):
            raise ConfigError(flag, f"unix socket path must be absolute: {text!r}")
        return text
    parsed = host_port(text)
    if parsed is None or not parsed[0] or parsed[1] == 0:
        raise ConfigError(flag, f"expected unix:///path or host:port, got {text!r}")
    return text


def _count(flag: str, text: str) -> int | None:
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(flag, f"must be a positive integer, got {text!r}")
    return int(text)


def _since(flag: str, text: str) -> int:
    if not text.isdigit():
        raise ConfigError(flag, f"must be a cycle sequence number (0 or more), got {text!r}")
    return int(text)


def _heartbeat(flag: str, text: str) -> float | None:
    if not text:
        return None
    try:
        value = float(text)
    except ValueError as exc:
        raise ConfigError(flag, f"not a number: {text!r}") from exc
    if not MIN_HEARTBEAT_S <= value <= MAX_HEARTBEAT_S:
        raise ConfigError(
            flag, f"must be between {MIN_HEARTBEAT_S} and {MAX_HEARTBEAT_S:g} seconds, got {text!r}"
        )
    return value


def _gpu(flag: str, text: str) -> int | str:
    if text.isdigit():
        return int(text)
    if not _UUID.fullmatch(text):
        raise ConfigError(flag, f"expected a GPU index or UUID, got {text!r}")
    return text


def _switch(flag: str, text: str) -> bool:
    value = text.lower()
    if value not in {"", "0", "1", "true", "false", "yes", "no"}:
        raise ConfigError(flag, f"must be true or false, got {text!r}")
    return value in {"1", "true", "yes"}


def _dra(flag: str, text: str) -> DraVersion | None:
    return enum_choice(DraVersion)(flag, text) if text else None


def _server_name(flag: str, text: str) -> str | None:
    if text and not re.fullmatch(r"[A-Za-z0-9.\-]{1,253}", text):
        raise ConfigError(flag, f"not a host name: {text!r}")
    return text or None


_JSON = Option(
    flag="--json",
    env="CAPWATCH_WATCH_JSON",
    default="false",
    convert=_switch,
    help="print each message as one JSON object per line",
)
# The agent to connect to, and how: shared with ``capwatch shim``.
CONNECTION_OPTIONS = (
    Option(
        flag="--target",
        env="CAPWATCH_TARGET",
        default=DEFAULT_TARGET,
        convert=_target,
        help="the agent: unix:///path or host:port",
    ),
    Option(
        flag="--tls-ca",
        env="CAPWATCH_TLS_CA",
        default="",
        convert=optional_path,
        help="PEM CA bundle to verify a TCP agent's certificate (turns TLS on)",
    ),
    Option(
        flag="--tls-cert",
        env="CAPWATCH_TLS_CERT",
        default="",
        convert=optional_path,
        help="PEM client certificate for mutual TLS (turns TLS on)",
    ),
    Option(
        flag="--tls-key",
        env="CAPWATCH_TLS_KEY",
        default="",
        convert=optional_path,
        help="PEM private key for --tls-cert",
    ),
    Option(
        flag="--tls-server-name",
        env="CAPWATCH_TLS_SERVER_NAME",
        default="",
        convert=_server_name,
        help="name the agent's certificate must carry (default: the target's host)",
    ),
)

_OPTIONS = (
    *CONNECTION_OPTIONS,
    Option(
        flag="--dra",
        env="CAPWATCH_WATCH_DRA",
        default="",
        convert=_dra,
        help="watch the kubelet's DRA health view instead: v1 or v1alpha1",
    ),
    Option(
        flag="--since",
        env="CAPWATCH_WATCH_SINCE",
        default="0",
        convert=_since,
        help="resume after this cycle sequence number (0: start with a snapshot)",
    ),
    Option(
        flag="--heartbeat",
        env="CAPWATCH_WATCH_HEARTBEAT",
        default="",
        convert=_heartbeat,
        help="seconds between heartbeats when no cycle completes (default: the agent's interval)",
    ),
    Option(
        flag="--count",
        env="CAPWATCH_WATCH_COUNT",
        default="",
        convert=_count,
        help="exit after this many messages",
    ),
    Option(
        flag="--gpu",
        env="CAPWATCH_WATCH_GPUS",
        default="",
        convert=_gpu,
        repeatable=True,
        help="show only this GPU (index or UUID), repeatable",
    ),
    log_level_option("warning"),
    LOG_FORMAT_OPTION,
)


def add_watch_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser, _OPTIONS)
    # A switch takes no value on the command line; its twin is true/false.
    parser.add_argument(
        _JSON.flag,
        dest=_JSON.dest,
        action="store_const",
        const="true",
        default=None,
        help=f"{_JSON.help} [env {_JSON.env}; default {_JSON.default}]",
    )


def watch_settings(namespace: argparse.Namespace, environ: Mapping[str, str]) -> WatchSettings:
    values = read_options(namespace, environ, (*_OPTIONS, _JSON))
    gpus: tuple[int | str, ...] = values["gpu"]
    settings = WatchSettings(
        target=values["target"],
        tls_ca=values["tls_ca"],
        tls_cert=values["tls_cert"],
        tls_key=values["tls_key"],
        tls_server_name=values["tls_server_name"],
        json=values["json"],
        dra=values["dra"],
        since=values["since"],
        heartbeat_s=values["heartbeat"],
        count=values["count"],
        indexes=tuple(g for g in gpus if isinstance(g, int)),
        uuids=tuple(g for g in gpus if isinstance(g, str)),
        log_level=values["log_level"],
        log_format=values["log_format"],
    )
    if (settings.tls_cert is None) != (settings.tls_key is None):
        raise ConfigError("--tls-cert", "--tls-cert and --tls-key go together")
    if settings.tls and settings.target.startswith("unix://"):
        raise ConfigError(
            "--tls-ca" if settings.tls_ca else "--tls-cert",
            "TLS is for TCP targets; the agent's unix socket is protected by file modes",
        )
    if settings.tls_server_name and not settings.tls:
        raise ConfigError("--tls-server-name", "needs TLS (--tls-ca or --tls-cert)")
    for flag, path in (
        ("--tls-ca", settings.tls_ca),
        ("--tls-cert", settings.tls_cert),
        ("--tls-key", settings.tls_key),
    ):
        if path is not None and not path.is_file():
            raise ConfigError(flag, f"{path} is not a readable file")
    if settings.dra is not None:
        for flag, used in (
            ("--since", settings.since != 0),
            ("--heartbeat", settings.heartbeat_s is not None),
            ("--gpu", bool(gpus)),
        ):
            if used:
                raise ConfigError(flag, "applies to the capwatch.v1 stream, not to --dra")
    return settings


def client_for(settings: WatchSettings) -> NodeHealthClient:
    """A client for ``settings``' target, TLS and filter. Raises ConfigError."""
    root = _read("--tls-ca", settings.tls_ca)
    chain = _read("--tls-cert", settings.tls_cert)
    key = _read("--tls-key", settings.tls_key)
    options: list[tuple[str, Any]] = []
    if settings.tls_server_name:
        options.append(("grpc.ssl_target_name_override", settings.tls_server_name))
    return NodeHealthClient(
        target=settings.target,
        root_certificates=root,
        certificate_chain=chain,
        private_key=key,
        heartbeat_interval=settings.heartbeat_s,
        indexes=settings.indexes,
        uuids=settings.uuids,
        options=options,
    )


def _read(flag: str, path: Path | None) -> bytes | None:
    try:
        return None if path is None else path.read_bytes()
    except OSError as exc:
        raise ConfigError(flag, f"cannot read {path}: {exc.strerror}") from exc


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
    client = client_for(settings)
    printer = _Printer(settings, out=out, err=err)
    async with client, _stopping_on_signals(stop):
        closer = asyncio.create_task(_close_when(stop, client))
        events: AsyncGenerator[Any, None] = (
            client.dra_devices(settings.dra)
            if settings.dra is not None
            else client.events(since=settings.since)
        )
        seen = 0
        try:
            async with contextlib.aclosing(events) as stream:
                async for event in stream:
                    if isinstance(event, Disconnected):
                        printer.disconnected(event)
                        if event.code in FATAL_CODES:
                            return EXIT_FAILED
                        continue
                    printer.message(event)
                    seen += 1
                    if settings.count is not None and seen >= settings.count:
                        break
        finally:
            closer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await closer
    return EXIT_OK


async def _close_when(stop: asyncio.Event, client: NodeHealthClient) -> None:
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


class _Printer:
    """Tables and status lines, or JSON lines; every write is flushed at once."""

    def __init__(self, settings: WatchSettings, *, out: TextIO, err: TextIO) -> None:
        self._settings = settings
        self._out = out
        self._err = err
        self._status = err if settings.json else out  # keep JSON output pure
        self._lost = False
        self._sequence = settings.since  # the last cycle shown (or asked to resume after)

    def message(self, event: Snapshot | Cycle | Heartbeat | DeviceList) -> None:
        if self._lost:
            self._lost = False
            self._line(self._status, f"reconnected to {self._settings.target}")
        if isinstance(event, Snapshot) and event.resync:
            self._line(
                self._status, f"resync: {self._resync_cause(event)}; showing its current state"
            )
        if isinstance(event, Snapshot):
            self._sequence = event.snapshot.sequence
        elif isinstance(event, Cycle):
            self._sequence = event.cycle.sequence
        if self._settings.json:
            self._line(self._out, as_json(_message(event)))
        elif isinstance(event, Snapshot):
            self._line(self._out, render_snapshot(event.snapshot) + "\n")
        elif isinstance(event, Cycle):
            self._line(self._out, render_cycle(event.cycle) + "\n")
        elif isinstance(event, Heartbeat):
            self._line(self._out, render_heartbeat(event.heartbeat))
        else:
            text = render_devices(event.response, version=event.version.value)
            self._line(self._out, text + "\n")

    def _resync_cause(self, event: Snapshot) -> str:
        if event.restarted:
            return "the agent restarted"
        if event.snapshot.sequence < self._sequence:
            # Only --since can be ahead: the agent's sequence never goes back.
            return (
                f"--since {self._sequence} is ahead of the agent's last cycle "
                f"({event.snapshot.sequence})"
            )
        return "the cycles missed are no longer buffered"

    def disconnected(self, event: Disconnected) -> None:
        self._lost = True
        if event.code in FATAL_CODES:
            self._line(self._err, f"capwatch watch: {self._settings.target}: {event.error}")
            return
        self._line(
            self._status,
            f"disconnected from {self._settings.target}: {event.error}; "
            f"retrying in {event.retry_in:.2f}s",
        )

    @staticmethod
    def _line(stream: TextIO, text: str) -> None:
        stream.write(text + "\n")
        stream.flush()


def as_json(message: Any) -> str:
    """One line of JSON with the proto field names grpcurl shows, zero values included
    (GPU 0's ``index``, ``ready: false``), so scripts need no defaults of their own."""
    return MessageToJson(
        message,
        indent=None,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )


def _message(event: Snapshot | Cycle | Heartbeat | DeviceList) -> Any:
    if isinstance(event, Snapshot):
        return pb.WatchResponse(snapshot=event.snapshot)
    if isinstance(event, Cycle):
        return pb.WatchResponse(cycle=event.cycle)
    if isinstance(event, Heartbeat):
        return pb.WatchResponse(heartbeat=event.heartbeat)
    return event.response
