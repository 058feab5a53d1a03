"""What holding one stream per node costs the process that holds them all, in each shape.

Pull (capwatch today): the controller dials every node's agent, so it holds one
client connection per node. Push (``docs/scale.md``): every agent dials the
controller over one long-lived stream, so the controller holds one *server*
connection per node. This measures the floor of each, bare grpc.aio on both
ends, nothing of capwatch's own per-node state:

* pull: a bare server listening at every node's own loopback address (the
  pod-IP shape, ``bench/cluster_procs.node_address``) serves capwatch.v1 Watch
  (an opening message, then one 8-GPU cycle message per interval);
  ``bench/floor_client.py`` dials each address and follows one Watch per node.
  Measured: the client's RSS.
* push: a bare server on one address takes one client-streaming call per node;
  agent processes open one connection each (a subchannel pool per channel) and
  send the same messages at the same pace. Measured: the server's RSS.

Both servers take capwatch's server options (``server.listeners.OPTIONS``), as
the agent's and the controller's do. Each holder's RSS is read after every
stream has its first message and 10 s of settling (``--settle``), against the
same process kind holding none (the interpreter, grpc, protobuf). Printed per
shape: RSS, KiB per connection, and the push / pull ratio; the controller's
target (512 MiB for 5,000 nodes) beside them.

Run: ``PYTHONPATH=. .venv/bin/python bench/connection_floor.py [--nodes 5000]``
(about two minutes at 5,000). Every process it starts it stops; 127.0.0.0/8 only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc

from bench.cluster_procs import node_address, rss_mib
from bench.figures import check_writable, spread, write_json
from client.channels import RECONNECT_OPTIONS
from client.retrying import CHANNEL_OPTIONS
from server.listeners import OPTIONS

WATCH = "/capwatch.v1.NodeHealthService/Watch"
REPORT = "/bench.Push/Report"
TARGET_MIB = 512  # the controller's, for 5,000 nodes
# A subchannel pool per channel: each agent's channel is a connection of its own.
OWN_CONNECTION = (("grpc.use_local_subchannel_pool", 1),)


def cycle_bytes() -> bytes:
    """An 8-GPU cycle message as an agent's Watch sends it (bench/stream_procs' payload)."""
    from bench.stream_procs import ServerSide

    return ServerSide().payload().SerializeToString()


# --- the child processes: each prints "ready ..." and runs until SIGTERM -------------


async def _until_terminated() -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()


async def pull_server(nodes: int, interval_s: float) -> None:
    """A bare Watch server at every node's own address, all on one port."""
    message = cycle_bytes()

    async def watch(request: bytes, context: Any) -> AsyncIterator[bytes]:
        while True:
            yield message
            await asyncio.sleep(interval_s)

    # capwatch's own server options: grpc core otherwise fails all but 1,000 calls not
    # yet matched to a handler, and 5,000 arrive at once.
    server = grpc.aio.server(options=OPTIONS)
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "capwatch.v1.NodeHealthService",
                {"Watch": grpc.unary_stream_rpc_method_handler(watch)},
            ),
        )
    )
    port = server.add_insecure_port(f"{node_address(0)}:0")
    for i in range(1, nodes):
        if server.add_insecure_port(f"{node_address(i)}:{port}") != port:
            raise SystemExit(f"pull server: cannot listen on {node_address(i)}:{port}")
    await server.start()
    print(f"ready {port}", flush=True)
    await _until_terminated()
    await server.stop(0)


async def push_server(expected: int) -> None:
    """The controller in the push shape, bare: one client-streaming call per agent."""
    streams = 0

    async def report(requests: AsyncIterator[bytes], context: Any) -> bytes:
        nonlocal streams
        streams += 1
        if streams == expected:
            print(f"open {streams}", flush=True)
        async for _ in requests:
            pass
        return b""

    # capwatch's own server options: grpc core otherwise fails all but 1,000 calls not
    # yet matched to a handler, and 5,000 arrive at once.
    server = grpc.aio.server(options=OPTIONS)
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "bench.Push", {"Report": grpc.stream_unary_rpc_method_handler(report)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"ready {port}", flush=True)
    await _until_terminated()
    await server.stop(0)


async def push_agents(port: int, count: int, interval_s: float) -> None:
    """``count`` agents, each on its own connection, each sending a cycle per interval."""
    message = cycle_bytes()

    async def messages() -> AsyncIterator[bytes]:
        while True:
            yield message
            await asyncio.sleep(interval_s)

    channels = [
        grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=OWN_CONNECTION) for _ in range(count)
    ]
    calls = [channel.stream_unary(REPORT)(messages()) for channel in channels]
    await asyncio.gather(*(channel.channel_ready() for channel in channels))
    print(f"ready {count}", flush=True)
    await _until_terminated()
    for call in calls:
        call.cancel()
    await asyncio.gather(*(channel.close() for channel in channels))


# --- the parent ---------------------------------------------------------------------


class Children:
    """Child processes started by this bench; every one is stopped on the way out."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, *argv],
            stdout=subprocess.PIPE,
            stderr=(self.work / f"{name}.err").open("w"),
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self.procs.append(proc)
        return proc

    def role(self, name: str, *args: object) -> subprocess.Popen[str]:
        return self.start(name, [__file__, "--role", name, *map(str, args)])

    def stop_all(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.procs = []


def expect(proc: subprocess.Popen[str], word: str, timeout_s: float, what: str) -> str:
    """The rest of the first line ``proc`` prints starting with ``word``."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    # select before each line: a child that stays silent must not hold the bench past its
    # deadline (the children print their few lines seconds apart: none waits in a buffer).
    while (left := deadline - time.monotonic()) > 0:
        if not select.select([proc.stdout], [], [], left)[0]:
            break
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{what} ended before saying {word!r} (exit {proc.wait()})")
        if line.startswith(word):
            return line[len(word) :].strip()
    raise RuntimeError(f"{what}: no {word!r} within {timeout_s:.0f} s")


def settled_rss(proc: subprocess.Popen[str], settle_s: float) -> float:
    time.sleep(settle_s)
    return rss_mib(proc.pid)


def pull(
    children: Children,
    nodes: int,
    interval_s: float,
    settle_s: float,
    options: Sequence[tuple[str, Any]] = (),
) -> dict[str, float]:
    """The pull holder's RSS with none and with ``nodes`` connections, its channels
    opened with ``options``; and how long it took to subscribe to every node."""
    server = children.role("pull-server", nodes, interval_s)
    port = int(expect(server, "ready", 120, "the pull server"))
    measured = {}
    subscribed_s = 0.0
    for n in (0, nodes):
        targets = children.work / f"targets-{n}.txt"
        targets.write_text("".join(f"node-{i} {node_address(i)}:{port}\n" for i in range(n)))
        argv = ["bench/floor_client.py", str(targets), json.dumps(list(options))]
        holder = children.start(f"pull-holder-{n}", argv)
        subscribed_s = float(expect(holder, "subscribed", 300, "the pull holder").split()[1])
        measured[n] = settled_rss(holder, settle_s)
        holder.send_signal(signal.SIGTERM)
        holder.wait(30)
    server.send_signal(signal.SIGTERM)
    server.wait(30)
    return {**shape(measured, nodes), "subscribe_s": subscribed_s}


def push(
    children: Children, nodes: int, interval_s: float, agent_procs: int, settle_s: float
) -> dict[str, float]:
    measured = {}
    for n in (0, nodes):
        server = children.role("push-server", n)
        port = int(expect(server, "ready", 60, "the push server"))
        agents = [
            children.role("push-agents", port, count, interval_s)
            for count in spread(n, agent_procs)
            if count
        ]
        for agent in agents:
            expect(agent, "ready", 300, "push agents")
        if n:
            expect(server, "open", 300, "the push server")
        measured[n] = settled_rss(server, settle_s)
        for proc in [*agents, server]:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    return shape(measured, nodes)


def shape(measured: dict[int, float], nodes: int) -> dict[str, float]:
    idle, busy = measured[0], measured[nodes]
    return {
        "idle_rss_mib": round(idle, 1),
        "rss_mib": round(busy, 1),
        "kib_per_connection": round((busy - idle) * 1024 / nodes, 1),
    }


def report(nodes: int, figures: dict[str, dict[str, float]]) -> Iterator[str]:
    for name, what in (("pull", "client: the controller dials"), ("push", "server: agents dial")):
        f = figures[name]
        yield (
            f"  {name} ({what}): {f['rss_mib']:.0f} MiB with {nodes} connections, "
            f"{f['idle_rss_mib']:.0f} MiB with none: {f['kib_per_connection']:.1f} KiB a "
            f"connection  [the controller's target: {TARGET_MIB} MiB at 5,000 nodes]"
        )
    ratio = figures["push"]["kib_per_connection"] / figures["pull"]["kib_per_connection"]
    yield f"  push / pull, KiB a connection: {ratio:.2f}"


# What a client channel holds for an idle connection, beside capwatch's own options (the
# controller's channels: keepalive, reconnect backoff, a subchannel pool each): the read
# buffer grpc core sizes each read with, the window BDP probing grows, the stream's
# lookahead (its initial flow-control window).
CAPWATCH = (*CHANNEL_OPTIONS, *RECONNECT_OPTIONS)
SMALL_READS = (
    ("grpc.experimental.tcp_read_chunk_size", 4096),
    ("grpc.experimental.tcp_min_read_chunk_size", 256),
    ("grpc.experimental.tcp_max_read_chunk_size", 16384),
)
NO_BDP = (("grpc.http2.bdp_probe", 0),)
SMALL_WINDOW = (("grpc.http2.lookahead_bytes", 16384),)
VARIANTS: dict[str, tuple[tuple[str, Any], ...]] = {
    "grpc-defaults": (),
    "capwatch": CAPWATCH,
    "capwatch+small-reads": (*CAPWATCH, *SMALL_READS),
    "capwatch+no-bdp": (*CAPWATCH, *NO_BDP),
    "capwatch+small-window": (*CAPWATCH, *SMALL_WINDOW),
    "capwatch+all": (*CAPWATCH, *SMALL_READS, *NO_BDP, *SMALL_WINDOW),
}


def variants(nodes: int, figures: dict[str, dict[str, float]]) -> Iterator[str]:
    base = figures["capwatch"]
    for name, f in figures.items():
        yield (
            f"  pull, {name}: {f['rss_mib']:.0f} MiB with {nodes} connections, "
            f"{f['kib_per_connection']:.1f} KiB a connection "
            f"({f['kib_per_connection'] / base['kib_per_connection']:.2f}x capwatch's), "
            f"subscribed in {f['subscribe_s']:.1f} s"
        )


ROLES: dict[str, Callable[..., Any]] = {
    "pull-server": lambda n, i: pull_server(int(n), float(i)),
    "push-server": lambda n: push_server(int(n)),
    "push-agents": lambda p, n, i: push_agents(int(p), int(n), float(i)),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--interval", type=float, default=15.0, help="seconds between cycles")
    parser.add_argument("--agent-procs", type=int, default=4, help="processes the agents share")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds before reading RSS")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=sorted(VARIANTS),
        help="pull only, once per set of client channel options (with capwatch's as the "
        "baseline each is compared to)",
    )
    parser.add_argument("--role", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        name, *rest = args.role
        asyncio.run(ROLES[name](*rest))
        return 0
    if args.variants:
        return _variants(args)
    if not 1 <= args.nodes <= 16384:
        parser.error("--nodes: 1 to 16384 (one loopback /24 per node)")
    check_writable(args.json)
    print(
        f"capwatch connection floor: {args.nodes} nodes, one stream each, a cycle every "
        f"{args.interval:g} s, grpcio {grpc.__version__}"
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="capwatch-floor-") as work:
        children = Children(Path(work))
        try:
            figures = {
                "pull": pull(children, args.nodes, args.interval, args.settle),
                "push": push(children, args.nodes, args.interval, args.agent_procs, args.settle),
            }
        finally:
            children.stop_all()
    for line in report(args.nodes, figures):
        print(line)
    print(f"  ({time.monotonic() - started:.0f} s in all)")
    if args.json is not None:
        write_json(args.json, {"nodes": args.nodes, **figures})
    return 0


def _variants(args: argparse.Namespace) -> int:
    names = ["capwatch", *(n for n in args.variants if n != "capwatch")]
    print(f"capwatch connection floor, pull, {args.nodes} nodes, grpcio {grpc.__version__}")
    figures = {}
    with tempfile.TemporaryDirectory(prefix="capwatch-floor-") as work:
        children = Children(Path(work))
        try:
            for name in names:
                figures[name] = pull(
                    children, args.nodes, args.interval, args.settle, VARIANTS[name]
                )
        finally:
            children.stop_all()
    for line in variants(args.nodes, figures):
        print(line)
    if args.json is not None:
        write_json(args.json, {"nodes": args.nodes, "pull_variants": figures})
    return 0


if __name__ == "__main__":
    sys.exit(main())
