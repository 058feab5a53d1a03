"""Fan-out against the number of subscribers: capwatch's Watch and a bare grpc.aio broadcast.

bench/stream.py's fan-out part (its own code, imported), run once for each
subscriber count in ``--subscribers``: at each count, fresh servers of both
kinds, each with its own client process and reading subscribers, rounds
alternated between the kinds (bare first, then capwatch first), a cycle
published every ``--pace`` seconds; the figures are medians of the rounds.
Printed per count as stream.py prints them, then a table of p50, p99 and the
hand-off against the count. Connections: ``--channels``, or one per
subscriber where there are fewer subscribers than that.

    PYTHONPATH=. .venv/bin/python bench/fanout.py [--subscribers 10,100,300,1000]
        [--json bench/results/fanout.json]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.figures import check_writable, write_json
from bench.stream import fan_out


def counts(text: str) -> list[int]:
    """``10,100,1000``: positive, rising subscriber counts."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of whole numbers: {text!r}") from None
    if not values or any(v < 1 for v in values) or values != sorted(set(values)):
        raise argparse.ArgumentTypeError(f"want rising counts of at least 1: {text!r}")
    return values


def sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    points = []
    for n in args.subscribers:
        at = argparse.Namespace(
            **{**vars(args), "subscribers": n, "channels": min(n, args.channels)}
        )
        with contextlib.ExitStack() as stack:
            points.append(fan_out(stack, at))
    return points


def table(points: list[dict[str, Any]]) -> str:
    rows = [
        f"  {'subscribers':>11}  {'p50 ms':>15}  {'p99 ms':>15}  {'hand-off ms':>15}  "
        "(capwatch / bare)"
    ]
    for p in points:
        ours, bare = p["capwatch"], p["bare"]
        cells = [f"{ours[k]:7.1f} / {bare[k]:5.1f}" for k in ("p50", "p99", "hand_off")]
        rows.append(f"  {p['subscribers']:>11}  " + "  ".join(f"{c:>15}" for c in cells))
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", type=counts, default=counts("10,100,300,1000"))
    parser.add_argument("--channels", type=int, default=10, help="connections, at most")
    parser.add_argument("--client-procs", type=int, default=1)
    parser.add_argument("--fanout-rounds", type=int, default=3, help="alternated, per count")
    parser.add_argument("--cycles", type=int, default=20, help="published per round")
    parser.add_argument("--pace", type=float, default=0.2, help="seconds between them")
    parser.add_argument("--json", type=Path, help="also write the figures here (bench/plot.py)")
    args = parser.parse_args()
    check_writable(args.json)
    load_at_start = os.getloadavg()[0]
    started = time.monotonic()
    print(
        f"capwatch fan-out sweep: {', '.join(map(str, args.subscribers))} subscribers, "
        f"{os.cpu_count()} CPUs, load average {load_at_start:.2f} at start"
    )
    points = sweep(args)
    print(table(points))
    print(
        f"  ({time.monotonic() - started:.0f} s in all; load average "
        f"{os.getloadavg()[0]:.2f} at the end)"
    )
    if args.json is not None:
        load = [round(load_at_start, 2), round(os.getloadavg()[0], 2)]
        write_json(args.json, {"load_average": load, "points": points})
    return 0


if __name__ == "__main__":
    sys.exit(main())
