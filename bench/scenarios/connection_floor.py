"""What holding one stream per node costs the process that holds them all, in each shape.

Pull (capwatch today): the controller dials every node's agent, so it holds one
client connection per node. Push (``docs/scale.md``): every agent dials the
controller over one long-lived stream, so the controller holds one *server*
connection per node. This measures the floor of each, bare grpc.aio on both
ends, nothing of capwatch's own per-node state:

* pull: a bare server listening at every node's own loopback address (the
  pod-IP shape, ``bench.shared.addresses.node_address``) serves capwatch.v1
  Watch, an 8-GPU cycle message per interval (bench/floors/watch_server.py);
  the bare client, bench/floors/watch_client.py, dials each address and follows
  one Watch per node. Measured: the client's RSS.
* push: a bare server on one address takes one client-streaming call per node;
  agent processes open one connection each (a subchannel pool per channel) and
  send the same messages at the same pace (bench/floors/push.py). Measured: the
  server's RSS.

Both servers take capwatch's server options (``server.listeners.OPTIONS``), as
the agent's and the controller's do; the message is the stream bench's
(bench/rigs/stream_server.py), written to a file every floor process reads.
Each holder's RSS is read after every stream has its first message and 10 s of
settling (``--settle``), against the same process kind holding none (the
interpreter, grpc, protobuf). Printed per shape: RSS, KiB per connection, and
the push / pull ratio; the controller's target (512 MiB for 5,000 nodes) beside
them.

Run: ``.venv/bin/python -m bench.scenarios.connection_floor [--nodes 5000]``
(about two minutes at 5,000). Every process it starts it stops; 127.0.0.0/8 only.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc

from bench.figures.results import check_writable, write_json
from bench.rigs.stream_server import cycle_message
from bench.shared.addresses import MAX_NODES, node_address
from bench.shared.children import Children, expect
from bench.shared.procs import rss_mib
from bench.shared.stats import spread
from capwatch.client.channels import RECONNECT_OPTIONS
from capwatch.client.retrying import CHANNEL_OPTIONS

TARGET_MIB = 512  # the controller's, for 5,000 nodes


def write_message(work: Path) -> Path:
    """The cycle message every floor process sends, in a file of ``work``."""
    path = work / "cycle.bin"
    path.write_bytes(cycle_message().SerializeToString())
    return path


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
    message = write_message(children.work)
    argv = ["-m", "bench.floors.watch_server", str(message), str(nodes), str(interval_s)]
    server = children.start("pull-server", argv)
    port = int(expect(server, "ready", 120, "the pull server"))
    measured = {}
    subscribed_s = 0.0
    for n in (0, nodes):
        targets = children.work / f"targets-{n}.txt"
        targets.write_text("".join(f"node-{i} {node_address(i)}:{port}\n" for i in range(n)))
        argv = ["-m", "bench.floors.watch_client", str(targets), json.dumps(list(options))]
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
    message = write_message(children.work)
    floor = ["-m", "bench.floors.push"]
    for n in (0, nodes):
        server = children.start("push-server", [*floor, "server", str(n)])
        port = int(expect(server, "ready", 60, "the push server"))
        agents = [
            children.start(
                "push-agents",
                [*floor, "agents", str(port), str(count), str(interval_s), str(message)],
            )
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
    args = parser.parse_args()
    if args.variants:
        return _variants(args)
    if not 1 <= args.nodes <= MAX_NODES:
        parser.error(f"--nodes: 1 to {MAX_NODES} (one loopback /24 per node)")
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
