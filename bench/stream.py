"""What the capwatch.v1 Watch stream delivers, and what it costs the agent.

Every server runs in a process of its own and the clients in others (spawned;
127.0.0.1 only), so on a 2-core machine client CPU does not sit in the
server's event loop. Cycle reports carry 8 GPUs, as on a full node; each
baseline is a bare grpc.aio server sending the same serialized bytes,
measured in the same run with the same client code.

Printed:
* throughput: cycle messages/s one client receives from capwatch's Watch,
  resuming from a ring of 80,000 distinct cycles published before the
  measurement (each message a cycle of its own, encoded for it), against a
  bare server-stream yielding one WatchResponse's bytes in a loop; best of 3
  alternated rounds (ratio, target >= 0.7). Beside it, for information, the
  live variant: the bench process also publishes every cycle it sends;
* publish -> receive latency p50/p99 over every delivery to 1,000 reading
  subscribers on 10 connections, a cycle published every 200 ms, and the
  time the server takes to hand all 1,000 messages to grpc; against a bare
  broadcast of one serialized message per cycle to the same streams
  (target p99 <= 100 ms);
* server RSS with 0 and 1,000 idle subscribers: KiB per subscriber (bare too);
* cycle duration (AgentLoop.cycle_once: reconcile_once on the simulator with
  bench/cycle.py's node, published into the hub on the cycle thread) with
  1,000 subscribers that never read, against none (ratio of the time until
  the report is in the hub, target <= 1.1), and when the cycle thread had
  woken the readers and the event loop had the report back. Two kinds:
  frozen (the client process SIGSTOPped: flow control holds their streams),
  and never reading (the application never reads, but grpc's client
  transport keeps accepting, so the server keeps serving them). 3 rounds,
  each phase against the phases without subscribers around it.

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

from bench.stream_procs import GPUS, REPLAY, Child, spread


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98]


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def throughput(stack: contextlib.ExitStack, args: argparse.Namespace) -> None:
    client = stack.enter_context(contextlib.closing(Child("client", "tput-client")))
    publish_s = 0.0

    def measure(kind: str) -> dict[str, float]:
        nonlocal publish_s
        with contextlib.closing(Child("server", f"{kind}-server")) as server:
            target = server.call("start", kind, timeout_s=120)
            if kind == "hub":
                server.call("flood_start")
            before, started = server.call("stats"), time.monotonic()
            since = 1 if kind == "replay" else 0
            figures = client.call("throughput", target, 1.0, args.seconds, since)
            after, wall = server.call("stats"), time.monotonic() - started
            figures["server_cpu"] = (after["cpu_s"] - before["cpu_s"]) / wall
            if kind == "replay":
                publish_s = after["publish_s"]
                # The stream must not have run out of cycles to replay.
                assert after["messages_sent"] < REPLAY, "replay ring exhausted: raise REPLAY"
            if kind == "hub":
                server.call("flood_stop")
        return figures

    # Alternated rounds, the best of each kind: the machine is shared and noisy.
    rounds: dict[str, list[dict[str, float]]] = {"bare-loop": [], "replay": []}
    for _ in range(args.rounds):
        for kind, results in rounds.items():
            results.append(measure(kind))
    live = measure("hub")
    bare, ours = (max(results, key=lambda f: f["per_s"]) for results in rounds.values())
    ratio = ours["per_s"] / bare["per_s"]

    def line(name: str, f: dict[str, float]) -> str:
        return (
            f"    {name:<26} {f['per_s']:7.0f} msg/s  {f['bytes']:.0f} B  "
            f"CPU: server {f['server_cpu']:.0%}, client {f['cpu']:.0%}"
        )

    def every(kind: str) -> str:
        return ", ".join(f"{f['per_s']:.0f}" for f in rounds[kind])

    print(
        f"  throughput, one client, best of {args.rounds} alternated rounds of {args.seconds:g} s "
        "after 1 s warm-up:\n"
        f"{line('capwatch Watch', ours)}  (resuming from a ring of {REPLAY} cycles; "
        f"every round: {every('replay')})\n"
        f"{line('bare grpc.aio stream', bare)}  (every round: {every('bare-loop')})\n"
        f"    ratio {ratio:.2f}  [target >= 0.7: {verdict(ratio >= 0.7)}]\n"
        f"{line('capwatch Watch, live', live)}  (ratio {live['per_s'] / bare['per_s']:.2f}; "
        f"the bench also publishes every cycle it sends, {publish_s * 1e6:.0f} us each)"
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

    def run() -> dict[str, Any]:
        before = server.call("stats")
        figures = server.call("cycles", args.loop_cycles, args.loop_interval, timeout_s=timeout)
        after = server.call("stats")
        sent = (after["messages_sent"] - before["messages_sent"]) / max(1, before["subscribers"])
        return {
            **{name: statistics.median(values) * 1000 for name, values in figures.items()},
            "max_published": max(figures["published"]) * 1000,
            "sent": sent,
            "subscribers": after["subscribers"],
        }

    def settle() -> None:
        for _ in range(50):  # let the server finish with closed streams first
            if server.call("stats")["subscribers"] == 0:
                return

    def frozen() -> dict[str, Any]:
        # SIGSTOP: nothing reads, not even the kernel; flow control stops each
        # stream after a few dozen cycles, which go by first. About 10 s after it
        # stops answering pings (keepalive timeout) the server drops the connection.
        client.call("open", target, n, args.channels, False)
        client.freeze(True)
        server.call("cycles", 30, 0.0, timeout_s=timeout)
        figures = run()
        client.freeze(False)
        client.call("close")
        settle()
        return figures

    def never_reading() -> dict[str, Any]:
        # The application never reads, but grpc's client transport goes on
        # accepting (its window grows), so the server serves these streams.
        client.call("open", target, n, args.channels, False)
        figures = run()
        client.call("close")
        settle()
        return figures

    # Phases with subscribers alternate with phases without, and each is compared
    # with the mean of its neighbours: the machine is shared, and its speed drifts
    # by a third between one few-second phase and the next.
    kinds = {f"{n} frozen": frozen, f"{n} never reading": never_reading}
    ratios: dict[str, list[float]] = {name: [] for name in kinds}
    lines = []

    def line(name: str, f: dict[str, Any]) -> str:
        return (
            f"    {name:<18} reconcile {f['reconcile']:5.2f}  published {f['published']:5.2f} "
            f"(max {f['max_published']:6.2f})  woken {f['woken']:6.2f}  "
            f"returned {f['returned']:6.2f}"
        )

    before = run()
    lines.append(line("no subscribers", before))
    for _ in range(args.cycle_rounds):
        for name, phase in kinds.items():
            figures = phase()
            after = run()
            base = {k: (before[k] + after[k]) / 2 for k in ("published", "woken")}
            ratio = figures["published"] / base["published"]
            ratios[name].append(ratio)
            lines += [
                line(name, figures),
                f"{'':22}published ratio {ratio:.2f}, woken ratio "
                f"{figures['woken'] / base['woken']:.2f}; cycles sent to each meanwhile: "
                f"{figures['sent']:.1f}; {figures['subscribers']} of {n} still subscribed",
                line("no subscribers", after),
            ]
            before = after
    # The median round: one round caught in a slow spell does not decide.
    verdicts = "; ".join(
        f"{name} {statistics.median(r):.2f} [target <= 1.1: {verdict(statistics.median(r) <= 1.1)}]"
        for name, r in ratios.items()
    )
    print(
        f"  cycle (AgentLoop.cycle_once), phases of {args.loop_cycles} cycles "
        f"{args.loop_interval * 1000:.0f} ms apart, {args.cycle_rounds} rounds; medians in ms "
        "from submit until the reconcile ended, the report was in the hub, the cycle thread "
        "had woken the readers, and the event loop had it back; ratios against the mean of "
        "the phases without subscribers before and after:\n"
        + "\n".join(lines)
        + f"\n    published ratio, median of rounds: {verdicts}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="throughput window")
    parser.add_argument("--rounds", type=int, default=3, help="alternated throughput rounds")
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--channels", type=int, default=10, help="connections, all clients")
    parser.add_argument("--client-procs", type=int, default=1)
    parser.add_argument("--cycles", type=int, default=20, help="published for latency")
    parser.add_argument("--pace", type=float, default=0.2, help="seconds between them")
    # Frozen subscribers are dropped ~10 s after they stop answering pings: keep
    # loop-cycles x loop-interval well under that.
    parser.add_argument("--loop-cycles", type=int, default=20)
    parser.add_argument("--loop-interval", type=float, default=0.2)
    parser.add_argument("--cycle-rounds", type=int, default=3)
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
