"""What the capwatch.v1 Watch stream delivers, and what it costs the agent.

Every server runs in a process of its own and the clients in others (spawned;
127.0.0.1 only), so on a 2-core machine client CPU does not sit in the
server's event loop. Cycle reports carry 8 GPUs, as on a full node; each
baseline is a bare grpc.aio server sending the same serialized bytes,
measured in the same run with the same client code.

Printed, with the three targets as ratios against the bare baseline of the
same run (alternated rounds, bare first in one round and capwatch first in the
next, each kind's server kept up for every round; the verdict is the median
of the rounds' ratios, but for the fan-out p99, below):
* throughput: cycle messages/s one client receives from capwatch's Watch,
  resuming from a ring of REPLAY distinct cycles published (and encoded, once
  for every stream) before the measurement, against a bare server-stream
  yielding one WatchResponse's bytes in a loop (target >= 0.8). Beside it, for
  information, the live variant: the bench process also publishes every cycle
  it sends;
* publish -> receive latency p50/p99 over every delivery to 1,000 reading
  subscribers on 10 connections, a cycle published every 200 ms, and the time
  the server takes to hand all 1,000 messages to grpc (hand-off); against a
  bare broadcast of one serialized message per cycle to the same streams
  (targets: p99 <= 1.2 x, hand-off <= 1.3 x). The p99 verdict is the p99 of
  all 15 rounds' deliveries (300,000 a kind) against the bare one's, printed
  with its spread (the same ratio leaving out each round in turn) and the
  tail's source: each server's full collections while measuring, and the
  share of the deliveries over the p99 in cycles during which one began.
  capwatch's server settles its start-up heap as the agent command does
  (kit/heap.py); the bare one is left as grpc.aio leaves it. This part is
  bench/scenarios/fanout.py's, which also runs it at several subscriber counts;
* server RSS with 0 and 1,000 idle subscribers: KiB per subscriber (bare too);
* cycle duration (AgentLoop.cycle_once: reconcile_once on the simulator with
  the benches' node, bench/rigs/node.py, published into the hub on the cycle
  thread) with 1,000 subscribers that never read, against none (ratio of the time until
  the report is in the hub, target <= 1.1), and when the cycle thread had
  woken the readers and the event loop had the report back. Two kinds:
  frozen (the client process SIGSTOPped: flow control holds their streams),
  and never reading (the application never reads, but grpc's client
  transport keeps accepting, so the server keeps serving them). 3 rounds,
  each phase against the phases without subscribers around it.

The machine is often shared: the load average is printed before and after.

The servers and clients are bench/rigs/stream_server.py's and stream_clients.py's; the
bare servers, bench/floors/watch_server.py's. ``--json FILE`` writes the figures for the
charts too (bench/figures/node_charts.py has the shape).

Run: ``make bench-stream`` (or ``.venv/bin/python -m bench.scenarios.stream``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import grpc

from bench.figures.results import check_writable, write_json
from bench.rigs.stream_clients import ClientSide
from bench.rigs.stream_server import GPUS, REPLAY, ServerSide
from bench.scenarios.fanout import HAND_OFF_TARGET, P99_TARGET, fan_out
from bench.shared.children import Child
from bench.shared.stats import paired, verdict

# The targets, as ratios against the bare baseline measured in the same run (the
# fan-out's are bench/scenarios/fanout.py's).
THROUGHPUT_TARGET = 0.8  # capwatch / bare messages per second, at least
CYCLE_TARGET = 1.1  # cycle until published with subscribers / without, at most
WARM_UP_S = 0.5  # of each throughput round, before counting


def throughput(stack: contextlib.ExitStack, args: argparse.Namespace) -> dict[str, Any]:
    client = stack.enter_context(contextlib.closing(Child(ClientSide, "tput-client")))
    # One server of each kind for every round, so rounds alternate within seconds of
    # each other rather than after a restart each (the replay ring takes a few to fill).
    kinds = {"bare": "bare-loop", "ours": "replay"}
    servers = {
        who: stack.enter_context(contextlib.closing(Child(ServerSide, f"{kind}-server")))
        for who, kind in kinds.items()
    }
    targets = {
        who: server.call("start", kinds[who], timeout_s=180) for who, server in servers.items()
    }

    def measure(server: Child, target: str, since: int) -> dict[str, float]:
        before = server.call("usage")
        figures = client.call("throughput", target, WARM_UP_S, args.seconds, since)
        after = server.call("usage")
        cpu_s = after["cpu_s"] - before["cpu_s"]
        sent = after["messages_sent"] - before["messages_sent"]
        # A stream that ran out of cycles to replay would measure heartbeats.
        assert since == 0 or sent < REPLAY, "replay ring exhausted: raise REPLAY"
        figures["server_cpu"] = cpu_s / (after["at"] - before["at"])
        figures["server_us"] = cpu_s / max(1, sent) * 1e6
        return figures

    rounds: dict[str, list[dict[str, float]]] = {"bare": [], "ours": []}
    for order in paired(args.rounds):
        for who in order:
            since = 1 if who == "ours" else 0  # capwatch: resume from the ring's first cycle
            rounds[who].append(measure(servers[who], targets[who], since))
    costs = servers["ours"].call("usage")
    with contextlib.closing(Child(ServerSide, "hub-server")) as server:
        target = server.call("start", "hub")
        server.call("flood_start")
        live = measure(server, target, 0)
        server.call("flood_stop")
    ratios = [o["per_s"] / b["per_s"] for o, b in zip(rounds["ours"], rounds["bare"], strict=True)]
    ratio = statistics.median(ratios)

    def line(name: str, results: list[dict[str, float]]) -> str:
        def median(key: str) -> float:
            return statistics.median(f[key] for f in results)

        every = ", ".join(f"{f['per_s']:.0f} ({f['server_us']:.0f} us)" for f in results)
        return (
            f"    {name:<22} {median('per_s'):7.0f} msg/s  {median('bytes'):.0f} B  "
            f"CPU: server {median('server_cpu'):.0%} ({median('server_us'):.0f} us a message), "
            f"client {median('cpu'):.0%}  (rounds: {every})"
        )

    print(
        f"  throughput, one client, medians of {args.rounds} alternated rounds of "
        f"{args.seconds:g} s after {WARM_UP_S:g} s warm-up; capwatch resumes from a ring of "
        f"{REPLAY} distinct cycles:\n"
        f"{line('capwatch Watch', rounds['ours'])}\n"
        f"{line('bare grpc.aio stream', rounds['bare'])}\n"
        f"    ratio {ratio:.2f} (rounds {', '.join(f'{r:.2f}' for r in ratios)})  "
        f"[target >= {THROUGHPUT_TARGET}: {verdict(ratio >= THROUGHPUT_TARGET)}]\n"
        f"{line('capwatch Watch, live', [live])}  (ratio "
        f"{live['per_s'] / statistics.median(f['per_s'] for f in rounds['bare']):.2f}; the bench "
        f"also publishes every cycle it sends: {costs['publish_s'] * 1e6:.0f} us each, and the "
        f"Watch feed encodes it once for every stream: {costs['encode_s'] * 1e6:.0f} us)"
    )
    return {
        "seconds": args.seconds,
        "msg_s": {
            "capwatch": [round(f["per_s"]) for f in rounds["ours"]],
            "bare": [round(f["per_s"]) for f in rounds["bare"]],
        },
        "server_us": {
            "capwatch": [round(f["server_us"], 1) for f in rounds["ours"]],
            "bare": [round(f["server_us"], 1) for f in rounds["bare"]],
        },
        "live_msg_s": round(live["per_s"]),
        "ratio": round(ratio, 3),
        "target": THROUGHPUT_TARGET,
    }


def cycle_cost(stack: contextlib.ExitStack, args: argparse.Namespace) -> dict[str, Any]:
    server = stack.enter_context(contextlib.closing(Child(ServerSide, "agent-server")))
    client = stack.enter_context(contextlib.closing(Child(ClientSide, "unread-client")))
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
        f"{name} {statistics.median(r):.2f} "
        f"[target <= {CYCLE_TARGET}: {verdict(statistics.median(r) <= CYCLE_TARGET)}]"
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
    return {
        "subscribers": n,
        "ratios": {
            name.removeprefix(f"{n} "): [round(r, 3) for r in rs] for name, rs in ratios.items()
        },
        "target": CYCLE_TARGET,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="throughput window")
    parser.add_argument("--rounds", type=int, default=7, help="alternated throughput rounds")
    parser.add_argument("--fanout-rounds", type=int, default=15, help="alternated fan-out rounds")
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
    parser.add_argument("--json", type=Path, help="also write the figures here (for the charts)")
    args = parser.parse_args()
    check_writable(args.json)
    print(
        f"capwatch stream benchmark: {GPUS}-GPU cycle reports, Python "
        f"{sys.version.split()[0]}, grpcio {grpc.__version__}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f} at start"
    )
    started = time.monotonic()
    load_at_start = os.getloadavg()[0]
    summary = []
    measured: dict[str, Any] = {}
    if args.only in (None, "throughput"):
        with contextlib.ExitStack() as stack:
            measured["throughput"] = throughput(stack, args)
        ratio = measured["throughput"]["ratio"]
        met = verdict(ratio >= THROUGHPUT_TARGET)
        summary.append(f"throughput {ratio:.2f} (>= {THROUGHPUT_TARGET}: {met})")
    if args.only in (None, "fanout"):
        with contextlib.ExitStack() as stack:
            measured["fanout"] = fan_out(stack, args)
        p99_ratio = measured["fanout"]["p99_ratio"]
        hand_ratio = measured["fanout"]["hand_off_ratio"]
        summary += [
            f"fan-out p99 {p99_ratio:.2f} (<= {P99_TARGET}: {verdict(p99_ratio <= P99_TARGET)})",
            f"hand-off {hand_ratio:.2f} (<= {HAND_OFF_TARGET}: "
            f"{verdict(hand_ratio <= HAND_OFF_TARGET)})",
        ]
    if args.only in (None, "cycle"):
        with contextlib.ExitStack() as stack:
            measured["cycle"] = cycle_cost(stack, args)
    if summary:
        print("  capwatch / bare, this run: " + "; ".join(summary))
    print(
        f"  ({time.monotonic() - started:.0f} s in all; load average "
        f"{os.getloadavg()[0]:.2f} at the end)"
    )
    if args.json is not None:
        load = [round(load_at_start, 2), round(os.getloadavg()[0], 2)]
        write_json(args.json, {"load_average": load, **measured})
    return 0


if __name__ == "__main__":
    sys.exit(main())
