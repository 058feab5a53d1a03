"""What the capwatch.v1 Watch stream delivers, and what it costs the agent.

Every server runs in a process of its own and the clients in others (spawned;
127.0.0.1 only), so on a 2-core machine client CPU does not sit in the
server's event loop. Cycle reports carry 8 GPUs, as on a full node; each
baseline is a bare grpc.aio server sending the same serialized bytes,
measured in the same run with the same client code.

Printed:
* throughput: cycle messages/s one client receives from capwatch while the
  bench publishes cycles into the hub as fast as the stream takes them (kept
  64-128 ahead, so the stream never waits and never resyncs; publishing is
  counted, as the agent pays it), against a bare server-stream yielding one
  WatchResponse's bytes in a loop (ratio, target >= 0.7);
* publish -> receive latency p50/p99 over every delivery to 1,000 reading
  subscribers on 10 connections, a cycle published every 200 ms, and the
  time the server takes to hand all 1,000 messages to grpc; against a bare
  broadcast of one serialized message per cycle to the same streams
  (target p99 <= 100 ms);
* server RSS with 0 and 1,000 idle subscribers: KiB per subscriber (bare too);
* cycle duration (reconcile_once on the simulator with bench/cycle.py's node,
  hand-off to the event loop and publish: AgentLoop.cycle_once) with 1,000
  subscribers that never read, against none (ratio, target <= 1.1). Two kinds:
  frozen (the client process SIGSTOPped: flow control holds their streams),
  and never reading (the application never reads, but grpc's client
  transport keeps accepting, so the server keeps serving them).

The machine is often shared: the load average is printed before and after.

Run: ``make bench-stream`` (or ``PYTHONPATH=. .venv/bin/python bench/stream.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from typing import Any

import grpc

from bench.stream_procs import GPUS, Child, spread


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98]


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def throughput(stack: contextlib.ExitStack, args: argparse.Namespace) -> None:
    client = stack.enter_context(contextlib.closing(Child("client", "tput-client")))
    figures = {}
    for kind in ("bare-loop", "hub"):
        with contextlib.closing(Child("server", f"{kind}-server")) as server:
            target = server.call("start", kind)
            if kind == "hub":
                server.call("flood_start")
            before, started = server.call("stats"), time.monotonic()
            figures[kind] = client.call("throughput", target, 1.0, args.seconds)
            after, wall = server.call("stats"), time.monotonic() - started
            figures[kind]["server_cpu"] = (after["cpu_s"] - before["cpu_s"]) / wall
            if kind == "hub":
                server.call("flood_stop")
    bare, ours = figures["bare-loop"], figures["hub"]
    ratio = ours["per_s"] / bare["per_s"]

    def line(name: str, f: dict[str, float]) -> str:
        return (
            f"    {name:<22} {f['per_s']:7.0f} msg/s  {f['bytes']:.0f} B  "
            f"CPU: server {f['server_cpu']:.0%}, client {f['cpu']:.0%}"
        )

    print(
        f"  throughput, one client, {args.seconds:g} s after 1 s warm-up:\n"
        f"{line('capwatch Watch', ours)}  (other messages: {ours['non_cycle']:.0f}, "
        "the snapshot)\n"
        f"{line('bare grpc.aio stream', bare)}\n"
        f"    ratio {ratio:.2f}  [target >= 0.7: {verdict(ratio >= 0.7)}]"
    )


def measure_fan_out(kind: str, clients: list[Child], args: argparse.Namespace) -> dict[str, Any]:
    with contextlib.closing(Child("server", f"{kind}-server")) as server:
        target = server.call("start", kind)
        server.call("publish", 1, 0.0)
        clients[0].call("open", target, 10, 1, True)  # warm-up: first connection and streams
        clients[0].call("close")
        idle = server.call("stats")
        for client, n, c in zip(
            clients,
            spread(args.subscribers, len(clients)),
            spread(args.channels, len(clients)),
            strict=True,
        ):
            client.send("open", target, n, c, True)
        for client in clients:
            client.result("open")
        busy = server.call("stats")
        assert busy["subscribers"] == args.subscribers, busy
        hand_off = server.call(
            "publish", args.cycles, args.pace, timeout_s=args.cycles * args.pace + 30
        )
        latencies: list[float] = []
        short = 0
        for client in clients:
            samples, missing = client.call("collect", args.cycles, 15.0, timeout_s=30)
            latencies += samples
            short += missing
            client.call("close")
    return {
        "ms": [x * 1000 for x in latencies],
        "short": short,
        "hand_off_ms": [x * 1000 for x in hand_off],
        "idle_kib": idle["rss_kib"],
        "busy_kib": busy["rss_kib"],
    }


def fan_out(stack: contextlib.ExitStack, args: argparse.Namespace) -> None:
    clients = [
        stack.enter_context(contextlib.closing(Child("client", f"fanout-client-{i}")))
        for i in range(args.client_procs)
    ]
    bare = measure_fan_out("bare-broadcast", clients, args)
    ours = measure_fan_out("hub", clients, args)

    def line(name: str, f: dict[str, Any]) -> str:
        ms = f["ms"]
        short = f", {f['short']} STREAMS SHORT" if f["short"] else ""
        return (
            f"    {name:<22} p50 {statistics.median(ms):5.1f} ms  p99 {p99(ms):5.1f} ms  "
            f"max {max(ms):5.1f} ms  ({len(ms)} deliveries{short})"
        )

    def memory(f: dict[str, Any]) -> str:
        per = (f["busy_kib"] - f["idle_kib"]) / args.subscribers
        return f"{per:.1f} KiB ({f['idle_kib'] / 1024:.1f} -> {f['busy_kib'] / 1024:.1f} MiB)"

    worst = p99(ours["ms"])
    hand = {
        name: statistics.median(f["hand_off_ms"]) for name, f in (("ours", ours), ("bare", bare))
    }
    print(
        f"  publish -> receive, {args.subscribers} subscribers on {args.channels} connections, "
        f"{args.client_procs} client process(es), {args.cycles} cycles {args.pace * 1000:.0f} ms"
        f" apart:\n{line('capwatch Watch', ours)}\n{line('bare grpc.aio fan-out', bare)}\n"
        f"    capwatch p99 {worst:.1f} ms  [target <= 100 ms: {verdict(worst <= 100)}]; "
        f"capwatch/bare p99 {worst / p99(bare['ms']):.2f}\n"
        f"    server time to hand one cycle to every stream (median): capwatch "
        f"{hand['ours']:.0f} ms, bare {hand['bare']:.0f} ms\n"
        f"  server RSS per idle subscriber: capwatch {memory(ours)}; "
        f"bare grpc.aio {memory(bare)}"
    )


def cycle_cost(stack: contextlib.ExitStack, args: argparse.Namespace) -> None:
    server = stack.enter_context(contextlib.closing(Child("server", "agent-server")))
    client = stack.enter_context(contextlib.closing(Child("client", "unread-client")))
    target = server.call("start", "agent")
    server.call("cycles", 20, 0.0)  # warm-up: the first cycle claims GPUs, writes the record
    timeout = args.loop_cycles * (args.loop_interval + 0.5) + 30
    n = args.subscribers

    def run() -> tuple[list[float], list[float], float, float, int]:
        before = server.call("stats")
        wall, reconcile = server.call(
            "cycles", args.loop_cycles, args.loop_interval, timeout_s=timeout
        )
        after = server.call("stats")
        sent = (after["messages_sent"] - before["messages_sent"]) / max(1, before["subscribers"])
        grown = (after["rss_kib"] - before["rss_kib"]) / 1024
        return wall, reconcile, sent, grown, after["subscribers"]

    alone = run()
    # Frozen (SIGSTOP): nothing reads, not even the kernel; flow control stops each
    # stream after a few dozen cycles, which go by first. About 10 s after it
    # stops answering pings (keepalive timeout) the server drops the connection.
    client.call("open", target, n, args.channels, False)
    client.freeze(True)
    server.call("cycles", 30, 0.0, timeout_s=timeout)
    frozen = run()
    client.freeze(False)
    client.call("close")
    for _ in range(50):  # let the server finish with the thawed streams first
        if server.call("stats")["subscribers"] == 0:
            break
    # The application never reads, but grpc's client transport goes on accepting
    # (its window grows), so the server serves these streams every cycle.
    client.call("open", target, n, args.channels, False)
    unread = run()
    client.call("close")

    def line(name: str, figures: tuple[list[float], list[float], float, float, int]) -> str:
        ratio = statistics.median(figures[0]) / statistics.median(alone[0])
        wall, returned = ([x * 1000 for x in d] for d in figures[:2])
        text = (
            f"    {name:<22} median {statistics.median(wall):5.2f} ms  max {max(wall):6.2f} ms"
            f"  (back on the event loop after {statistics.median(returned):.2f} ms)"
        )
        if figures is alone:
            return text
        return (
            f"{text}\n{'':26}ratio {ratio:.2f} [target <= 1.1: {verdict(ratio <= 1.1)}]; "
            f"cycles sent to each meanwhile: {figures[2]:.1f}; server RSS {figures[3]:+.1f} MiB; "
            f"{figures[4]} of {n} still subscribed"
        )

    print(
        f"  cycle (AgentLoop.cycle_once, submit to published in the hub), "
        f"{args.loop_cycles} cycles {args.loop_interval * 1000:.0f} ms apart:\n"
        f"{line('no subscribers', alone)}\n{line(f'{n} frozen', frozen)}\n"
        f"{line(f'{n} never reading', unread)}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="throughput window")
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--channels", type=int, default=10, help="connections, all clients")
    parser.add_argument("--client-procs", type=int, default=1)
    parser.add_argument("--cycles", type=int, default=20, help="published for latency")
    parser.add_argument("--pace", type=float, default=0.2, help="seconds between them")
    # Frozen subscribers are dropped ~10 s after they stop answering pings: keep
    # loop-cycles x loop-interval well under that.
    parser.add_argument("--loop-cycles", type=int, default=30)
    parser.add_argument("--loop-interval", type=float, default=0.2)
    parser.add_argument("--only", choices=("throughput", "fanout", "cycle"))
    args = parser.parse_args()
    print(
        f"capwatch stream benchmark: {GPUS}-GPU cycle reports, Python "
        f"{sys.version.split()[0]}, grpcio {grpc.__version__}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f} at start"
    )
    started = time.monotonic()
    for name, part in (("throughput", throughput), ("fanout", fan_out), ("cycle", cycle_cost)):
        if args.only in (None, name):
            with contextlib.ExitStack() as stack:
                part(stack, args)
    print(
        f"  ({time.monotonic() - started:.0f} s in all; load average "
        f"{os.getloadavg()[0]:.2f} at the end)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
