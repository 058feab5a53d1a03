"""``capwatch pool``: many simulated nodes behind one gRPC server, for scale tests and demos.

Every node of the pool (:mod:`capwatch.agent.sim.pool`) is served as a node agent is --
capwatch.v1 ``Watch`` and ``GetSnapshot``, the DRA mirrors, heartbeats, resume --
selected by the node name in the request (:mod:`capwatch.server.grpc.nodes`). A controller
follows a pool exactly as it follows real agents: one stream per node, naming
its node; a static targets file lists every node at the pool's address
(``--targets-out`` writes it).

Faults on a schedule (``--fault KIND:FRACTION@START+DURATION[/EVERY]``, see
:mod:`capwatch.agent.sim.poolspec`) give the controller transitions to detect; with
``--transitions-out`` every change of a node's enforcement is written as one
JSON line (node, cycle sequence, enforced, the cycle's end in wall-clock and
in monotonic seconds), which is what a benchmark measures detection latency
from. Not
for real GPUs, and nothing here writes to disk but those two files.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from capwatch.agent.reports import CycleReport
from capwatch.agent.sim.pool import Pool, PoolNode, PoolSettings
from capwatch.agent.sim.poolspec import PoolFaultKind, node_names, parse_fault
from capwatch.kit.addresses import host_port
from capwatch.kit.clock import Clock, SystemClock
from capwatch.kit.errors import ConfigError
from capwatch.kit.flags import (
    LOG_FORMAT_OPTION,
    LogFormat,
    Option,
    add_options,
    is_digits,
    log_level_option,
    optional_path,
    positive_float,
    read_options,
)
from capwatch.kit.names import MAX_SUBDOMAIN, is_node_name
from capwatch.server.grpc.mapping import DeviceNamer
from capwatch.server.grpc.nodes import ManyNodes, NodeState
from capwatch.server.grpc.publication import Publication
from capwatch.server.grpc.serving import AgentServer
from capwatch.server.settings import DEFAULT_DEVICE_NAME, Listener, ServerSettings

log = logging.getLogger(__name__)

MAX_NODES = 20_000
MAX_GPUS = 64
# A pool serves one controller-like client per node, and test tools besides.
STREAMS_PER_NODE = 16


@dataclass(frozen=True, kw_only=True)
class PoolCommand:
    pool: PoolSettings
    listen: tuple[str, ...]  # every node is served on each
    targets_out: Path | None
    transitions_out: Path | None
    log_level: str
    log_format: LogFormat


def _count(limit: int) -> Callable[[str, str], int]:
    def convert(flag: str, text: str) -> int:
        if not is_digits(text) or not 1 <= int(text) <= limit:
            raise ConfigError(flag, f"must be an integer from 1 to {limit}, got {text!r}")
        return int(text)

    return convert


def _index(flag: str, text: str) -> int:
    if not is_digits(text):
        raise ConfigError(flag, f"must be a non-negative integer, got {text!r}")
    return int(text)


def _prefix(flag: str, text: str) -> str:
    # Every name is the prefix and a number: valid for all when valid with "0".
    prefix = text.lower()
    if not is_node_name(f"{prefix}0"):
        raise ConfigError(
            flag,
            f"nodes would be named {prefix + '0'!r}, ...: not Kubernetes node names (a-z, "
            "0-9, '-' and '.', each dot-separated part starting and ending with a letter or "
            "digit)",
        )
    return prefix


def _listen(flag: str, text: str) -> str:
    if host_port(text) is None:
        raise ConfigError(flag, f"expected host:port, got {text!r}")
    return text


_OPTIONS = (
    Option(
        flag="--nodes",
        env="CAPWATCH_POOL_NODES",
        default="12",
        convert=_count(MAX_NODES),
        help="how many simulated nodes",
    ),
    Option(
        flag="--name-prefix",
        env="CAPWATCH_POOL_NAME_PREFIX",
        default="sim-node-",
        convert=_prefix,
        help="node names are this prefix and a number",
    ),
    Option(
        flag="--first-index",
        env="CAPWATCH_POOL_FIRST_INDEX",
        default="0",
        convert=_index,
        help="the first node's number (several pools make one cluster)",
    ),
    Option(
        flag="--gpus",
        env="CAPWATCH_POOL_GPUS",
        default="8",
        convert=_count(MAX_GPUS),
        help="GPUs per node",
    ),
    Option(
        flag="--interval",
        env="CAPWATCH_POOL_INTERVAL",
        default="15",
        convert=positive_float,
        help="seconds each node sleeps after its cycle (cycles are staggered over it)",
    ),
    Option(
        flag="--fault",
        env="CAPWATCH_POOL_FAULTS",
        default="",
        convert=lambda flag, text: text,
        repeatable=True,
        help="KIND:FRACTION@START+DURATION[/EVERY], KIND one of write_failed, hang, silent, "
        "vanish; repeatable",
    ),
    Option(
        flag="--grpc-listen",
        env="CAPWATCH_POOL_GRPC_LISTEN",
        default="127.0.0.1:50051",
        convert=_listen,
        repeatable=True,
        help="where every node is served, repeatable (a node's own pod IP in a KWOK "
        "cluster: any address, the Watch request's node_name selects the node)",
    ),
    Option(
        flag="--targets-out",
        env="CAPWATCH_POOL_TARGETS_OUT",
        default="",
        convert=optional_path,
        help="write a 'NODE ADDRESS' targets file for capwatch controller --targets "
        "(every node at the first --grpc-listen)",
    ),
    Option(
        flag="--transitions-out",
        env="CAPWATCH_POOL_TRANSITIONS_OUT",
        default="",
        convert=optional_path,
        help="append one JSON line per change of a node's enforcement (for benchmarks)",
    ),
    log_level_option("info"),
    LOG_FORMAT_OPTION,
)


def add_pool_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser, _OPTIONS)


def pool_command(namespace: argparse.Namespace, environ: Mapping[str, str]) -> PoolCommand:
    values = read_options(namespace, environ, _OPTIONS)
    faults = tuple(
        parse_fault("--fault", text, slot=slot) for slot, text in enumerate(values["fault"])
    )
    listen: tuple[str, ...] = values["grpc_listen"]
    if len(set(listen)) != len(listen):
        raise ConfigError("--grpc-listen", "the same address is given twice")
    names = node_names(values["nodes"], prefix=values["name_prefix"], first=values["first_index"])
    if len(last := names[-1]) > MAX_SUBDOMAIN:
        raise ConfigError(
            "--first-index",
            f"the last node's name would be {len(last)} characters long, more than a "
            f"Kubernetes node name's {MAX_SUBDOMAIN}",
        )
    return PoolCommand(
        pool=PoolSettings(
            nodes=values["nodes"],
            name_prefix=values["name_prefix"],
            first_index=values["first_index"],
            gpus=values["gpus"],
            interval_s=values["interval"],
            faults=faults,
        ),
        listen=listen,
        targets_out=values["targets_out"],
        transitions_out=values["transitions_out"],
        log_level=values["log_level"],
        log_format=values["log_format"],
    )


def pool_server_settings(listen: tuple[str, ...]) -> ServerSettings:
    return ServerSettings(
        listeners=tuple(Listener(address=address) for address in listen),
        tls=None,
        socket_group=None,
        dra_pool_name=None,
        dra_device_name=DEFAULT_DEVICE_NAME,
        max_subscribers=STREAMS_PER_NODE,
        grace_s=1.0,
        reserved_local_subscribers=0,
        max_streams_per_peer=STREAMS_PER_NODE,
    )


class _Transitions:
    """One JSON line per change of a node's enforcement (written on the cycle thread)."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._enforced: dict[str, bool] = {}

    def __call__(self, node: PoolNode, report: CycleReport) -> None:
        if self._enforced.get(node.name) == report.enforced:
            return
        self._enforced[node.name] = report.enforced
        line = {
            "node": node.name,
            "sequence": report.sequence,
            "enforced": report.enforced,
            "finished_wall": report.finished_wall,
            # CLOCK_MONOTONIC: one clock for every process on the machine (benchmarks).
            "finished_monotonic": report.finished_monotonic,
            "failure": report.failure_summary,
        }
        self._out.write(json.dumps(line) + "\n")
        self._out.flush()


def node_state(kinds: frozenset[PoolFaultKind]) -> NodeState:
    """How a node under ``kinds`` of fault is served (a hung node still answers)."""
    if PoolFaultKind.VANISH in kinds:
        return NodeState.VANISHED
    if PoolFaultKind.SILENT in kinds:
        return NodeState.SILENT
    return NodeState.SERVING


def served_nodes(pool: Pool, *, clock: Clock, namer: DeviceNamer) -> ManyNodes:
    """Every node of ``pool`` as the services serve it: a publication of its own hub."""
    return ManyNodes(
        {
            name: Publication(
                hub=node.hub,
                clock=clock,
                node_name=name,
                interval_s=pool.settings.interval_s,
                namer=namer,
                pool_name=name,
                max_subscribers=STREAMS_PER_NODE,
                max_per_peer=STREAMS_PER_NODE,
            )
            for name, node in pool.nodes.items()
        }
    )


def write_targets(path: Path, names: Iterable[str], address: str) -> None:
    """``NODE ADDRESS`` for every node, written whole (a temporary file renamed over
    ``path``), so a controller started when it appears reads every node. Raises
    ConfigError."""
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        temporary.write_text("".join(f"{name} {address}\n" for name in names))
        os.replace(temporary, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        raise ConfigError("--targets-out", f"cannot write {path}: {exc.strerror}") from exc


async def run_pool(
    command: PoolCommand, *, clock: Clock | None = None, stop: asyncio.Event | None = None
) -> int:
    """Serve the pool until SIGTERM/SIGINT (or ``stop``). Raises CapwatchError at start."""
    transitions_file = None
    if command.transitions_out is not None:
        try:
            transitions_file = command.transitions_out.open("a", encoding="utf-8")
        except OSError as exc:
            raise ConfigError("--transitions-out", f"cannot open: {exc.strerror}") from exc
    try:
        return await _serve(
            command, clock or SystemClock(), stop or asyncio.Event(), transitions_file
        )
    finally:
        if transitions_file is not None:
            transitions_file.close()


async def _serve(
    command: PoolCommand, clock: Clock, stop: asyncio.Event, transitions_file: TextIO | None
) -> int:
    loop = asyncio.get_running_loop()
    holder: dict[str, ManyNodes] = {}

    def on_faults(node: str, kinds: frozenset[PoolFaultKind]) -> None:
        loop.call_soon_threadsafe(holder["nodes"].set_state, node, node_state(kinds))

    pool = Pool(
        command.pool,
        clock=clock,
        on_faults=on_faults,
        on_cycle=None if transitions_file is None else _Transitions(transitions_file),
    )
    settings = pool_server_settings(command.listen)
    nodes = holder["nodes"] = served_nodes(pool, clock=clock, namer=settings.device_namer())
    server = AgentServer(settings=settings, nodes=nodes, on_fatal=stop.set)
    await server.start()
    address = server.addresses[0]
    if command.targets_out is not None:
        try:
            write_targets(command.targets_out, pool.names(), address)
        except ConfigError:
            await server.stop()
            raise
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    pool.start()
    log.info(
        "pool serving nodes=%d gpus=%d interval=%gs address=%s faults=%d",
        len(pool.nodes),
        command.pool.gpus,
        command.pool.interval_s,
        address,
        len(command.pool.faults),
    )
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await server.stop()
        pool.stop()
    log.info("pool stopped cycles=%d skipped=%d", pool.cycles, pool.skipped)
    return 0
