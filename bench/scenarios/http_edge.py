"""The HTTP edge (capwatch.server.http.serving, httptools) against a bare asyncio floor.

Each server is a process of its own serving ``GET /readyz`` with a fixed 200 on
127.0.0.1 (an ephemeral port): the edge's ``PathServer`` with one route, and the
floor (bench/floors/http_handler.py, the readiness shim's), the least an HTTP
server on the same stack can do: an ``asyncio.start_server`` handler (stdlib
only) that reads the request head and writes the same 200 with ``Connection:
close``. The floor is the baseline of every ratio, measured in the same run.

The client is this process, one connection per request (connect, GET with
``Connection: close`` as the kubelet's prober sends, read to the close), in
two shapes, each bounded:
* sequential: ``--requests`` one after the other (latency p50/p99);
* bursts: ``--bursts`` times ``--burst`` requests at once (latency p50/p99
  from each connect, queueing included).
The servers are loaded in turn, ``--rounds`` times (a neighbour's burst on a
shared 2-core machine hits every server alike), each round's latencies pooled.

Printed: latencies, the server's CPU per 1,000 requests, its resident memory
(VmRSS) idle (started, nothing served) and after the load, and every figure's
ratio to the floor's. ``--compare NAME=MODULE`` (repeatable) serves with another module
of the same shape (``PathServer``, ``Request``, ``Response``: a candidate edge, or the one
it would replace) in the same run. Run: ``.venv/bin/python -m bench.scenarios.http_edge``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from functools import partial

from bench.floors.http_handler import BODY
from bench.rigs.http_load import HOST, Exchange
from bench.shared.children import stop_process, until_terminated
from bench.shared.procs import cpu_seconds, status_kib

EDGE = "capwatch.server.http.serving"
# How each kind's server is started: the floor's own module, this one's serving role.
SERVERS = {
    "floor": ("-m", "bench.floors.http_handler"),
    "edge": ("-m", "bench.scenarios.http_edge", "--role", "serve", "--module", EDGE),
}
TIMEOUT_S = 5.0  # a request without an answer by then counts as failed


async def serve(module: str) -> None:
    """``module``'s edge serving the fixed 200 on an ephemeral port (printed first) until
    SIGTERM."""
    edge_module = importlib.import_module(module)
    response = edge_module.Response(status=200, body=BODY)

    async def ready(request: object) -> object:
        return response

    edge = edge_module.PathServer({"/readyz": ready}, host=HOST, port=0)
    await edge.start()
    print(edge.port, flush=True)
    await until_terminated()
    await edge.stop()


async def exchange(port: int) -> float | None:
    """Seconds from the connect to the end of a 200; None without one."""
    loop = asyncio.get_running_loop()
    begin = time.perf_counter()
    done: asyncio.Future[bytes] = loop.create_future()
    try:
        transport, _ = await loop.create_connection(partial(Exchange, done), HOST, port)
    except OSError:
        return None
    try:
        async with asyncio.timeout(TIMEOUT_S):
            answer = await done
    except TimeoutError:
        transport.abort()
        return None
    except OSError:  # reset, or closed without an answer
        return None
    if not answer.startswith(b"HTTP/1.1 200 ") or not answer.endswith(BODY):
        return None
    return time.perf_counter() - begin


@dataclass
class Server:
    kind: str
    proc: asyncio.subprocess.Process
    port: int
    idle_kib: int = 0
    sequential: list[float] = field(default_factory=list)
    burst: list[float] = field(default_factory=list)
    failed: int = 0
    cpu_s: float = 0.0
    requests: int = 0

    async def load(self, args: argparse.Namespace) -> None:
        before = cpu_seconds(self.proc.pid)
        for _ in range(args.requests):
            self.record(await exchange(self.port), self.sequential)
        for _ in range(args.bursts):
            for took in await asyncio.gather(*(exchange(self.port) for _ in range(args.burst))):
                self.record(took, self.burst)
        self.cpu_s += cpu_seconds(self.proc.pid) - before
        self.requests += args.requests + args.bursts * args.burst

    def record(self, took: float | None, into: list[float]) -> None:
        if took is None:
            self.failed += 1
        else:
            into.append(took * 1000)


def percentile(ms: list[float], p: int) -> float:
    if len(ms) < 2:
        return ms[0] if ms else float("nan")
    return statistics.quantiles(ms, n=100)[p - 1]


async def start(kind: str, argv: tuple[str, ...]) -> Server:
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, *argv),
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    port = int(await asyncio.wait_for(proc.stdout.readline(), 30))
    await asyncio.sleep(0.5)  # settled
    return Server(kind=kind, proc=proc, port=port, idle_kib=status_kib(proc.pid))


def report(servers: list[Server]) -> None:
    floor = servers[0]
    figures = {
        s.kind: {
            "seq p50 ms": percentile(s.sequential, 50),
            "seq p99 ms": percentile(s.sequential, 99),
            "burst p50 ms": percentile(s.burst, 50),
            "burst p99 ms": percentile(s.burst, 99),
            "CPU ms/1k": s.cpu_s * 1000 / s.requests * 1000,
            "RSS idle MiB": s.idle_kib / 1024,
            "RSS after MiB": status_kib(s.proc.pid) / 1024,
            "RSS peak MiB": status_kib(s.proc.pid, "VmHWM") / 1024,
        }
        for s in servers
    }
    print(f"  {'':<14}" + "".join(f"{s.kind:>10}" for s in servers) + "   ratio to floor")
    for name, floors in figures[floor.kind].items():
        values = "".join(f"{figures[s.kind][name]:>10.2f}" for s in servers)
        ratios = "  ".join(f"{figures[s.kind][name] / floors:.2f}" for s in servers[1:])
        print(f"  {name:<14}{values}   {ratios}")
    failed = ", ".join(f"{s.kind} {s.failed}" for s in servers)
    print(f"  requests without a 200: {failed}")


async def bench(args: argparse.Namespace) -> int:
    print(
        f"capwatch HTTP edge benchmark: GET /readyz, a connection per request; "
        f"{args.requests} sequential + {args.bursts} bursts of {args.burst}, "
        f"{args.rounds} rounds alternated; Python {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start"
    )
    started = time.monotonic()
    servers: list[Server] = []
    try:
        for kind, argv in kinds(args.compare).items():
            servers.append(await start(kind, argv))
        for server in servers:  # warm-up, not measured
            for _ in range(50):
                await exchange(server.port)
        for _ in range(args.rounds):
            for server in servers:
                await server.load(args)
        report(servers)
    finally:
        for server in servers:
            await stop_process(server.proc, 10)
    print(
        f"  ({time.monotonic() - started:.0f} s in all; load average "
        f"{os.getloadavg()[0]:.2f} at the end)"
    )
    return 1 if any(s.failed for s in servers) else 0


def kinds(compare: list[str]) -> dict[str, tuple[str, ...]]:
    """The servers of this run, the floor first: the edge, and each NAME=MODULE compared."""
    servers = dict(SERVERS)
    for entry in compare:
        name, _, module = entry.partition("=")
        servers[name] = (*SERVERS["edge"][:-1], module)
    return servers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="sequential, per round")
    parser.add_argument("--burst", type=int, default=100, help="concurrent requests a burst")
    parser.add_argument("--bursts", type=int, default=10, help="bursts per round")
    parser.add_argument("--rounds", type=int, default=2, help="servers loaded in turn")
    parser.add_argument(
        "--compare", action="append", default=[], metavar="NAME=MODULE", help="another edge"
    )
    # Internal: the servers this bench spawns.
    parser.add_argument("--role", choices=("bench", "serve"), default="bench")
    parser.add_argument("--module", default=EDGE)
    args = parser.parse_args()
    for entry in args.compare:
        name, equals, module = entry.partition("=")
        if not (equals and name and module) or name in SERVERS:
            parser.error(f"--compare {entry!r}: expected NAME=MODULE, NAME not floor or edge")
    if args.role == "serve":
        asyncio.run(serve(args.module))
        return 0
    return asyncio.run(bench(args))


if __name__ == "__main__":
    sys.exit(main())
