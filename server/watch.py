"""``capwatch watch``: follow a node agent's stream from a terminal or a script.

By default the per-GPU table (redrawn in place on a terminal, only what
changed elsewhere: see server/printer.py) and a line per disconnect,
reconnect or resync; ``--json`` prints each message as one JSON object per
line instead (status lines then go to stderr); ``--dra v1`` follows the
kubelet's view (``NodeWatchResources``). Once connected it reconnects for
ever, resuming where it left off, until ``--count`` messages, Ctrl-C or
SIGTERM (exit 0). An agent never reached (unless ``--retry``) or one that
rejects the request (bad argument, service not served) exits 1; a ``--gpu``
the agent does not have exits 2.
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

from agent.errors import ConfigError
from agent.flags import Option, add_options, enum_choice, optional_path, read_options
from agent.settings import LOG_FORMAT_OPTION, LogFormat, log_level_option
from server.client import (
    Cycle,
    Disconnected,
    DraVersion,
    NodeHealthClient,
    Snapshot,
)
from server.gen.capwatch.v1 import node_health_pb2 as pb
from server.limits import MAX_HEARTBEAT_S, MIN_HEARTBEAT_S
from server.settings import DEFAULT_SOCKET, host_port

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
    retry: bool  # keep trying an agent never reached (else exit 1 at the first failure)
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
    switch=True,
)
_RETRY = Option(
    flag="--retry",
    env="CAPWATCH_WATCH_RETRY",
    default="false",
    convert=_switch,
    help="keep trying an agent that cannot be reached at first (default: exit 1 saying why)",
    switch=True,
)
_SWITCHES = (_JSON, _RETRY)
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
    add_options(parser, (*_OPTIONS, *_SWITCHES))


def watch_settings(namespace: argparse.Namespace, environ: Mapping[str, str]) -> WatchSettings:
    values = read_options(namespace, environ, (*_OPTIONS, *_SWITCHES))
    gpus: tuple[int | str, ...] = values["gpu"]
    settings = WatchSettings(
        target=values["target"],
        tls_ca=values["tls_ca"],
        tls_cert=values["tls_cert"],
        tls_key=values["tls_key"],
        tls_server_name=values["tls_server_name"],
        json=values["json"],
        retry=values["retry"],
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
    # Here, not at the top: `capwatch shim` imports this module for its connection
    # options, and must not load the terminal library the printer draws with.
    from server.printer import Printer  # noqa: PLC0415

    stop = stop or asyncio.Event()
    client = client_for(settings)
    printer = Printer(
        target=settings.target, json=settings.json, since=settings.since, out=out, err=err
    )
    async with client, _stopping_on_signals(stop):
        closer = asyncio.create_task(_close_when(stop, client))
        events: AsyncGenerator[Any, None] = (
            client.dra_devices(settings.dra)
            if settings.dra is not None
            else client.events(since=settings.since)
        )
        seen = 0
        reached = False
        unchecked = bool(settings.indexes or settings.uuids)
        try:
            async with contextlib.aclosing(events) as stream:
                async for event in stream:
                    if isinstance(event, Disconnected):
                        if event.code in FATAL_CODES:
                            printer.refused(event)
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
            printer.close()
            closer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await closer
    return EXIT_OK


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
