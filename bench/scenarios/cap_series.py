"""Series the agent serves while 110 pods churn over 8 GPUs (the cap gauges' pod labels).

The cap gauges carry the owning pod's namespace and name; this shows the
count stays at one series per GPU per gauge however many pods pass, and how
many distinct cap series a Prometheus would see over the run (each lives in
its TSDB head until it goes stale, then ages out with its block).

    .venv/bin/python -m bench.scenarios.cap_series [--gpus 8] [--pods 110] [--cycles 330]
"""

from __future__ import annotations

import argparse
import time

from tests.metrics.churn import churn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--pods", type=int, default=110)
    parser.add_argument("--cycles", type=int, default=330)
    args = parser.parse_args()
    start = time.perf_counter()
    figures = churn(gpus=args.gpus, pods=args.pods, cycles=args.cycles)
    elapsed = time.perf_counter() - start
    print(f"{args.gpus} GPUs, {args.pods} pods, {args.cycles} cycles, a scrape after each")
    print(f"series served before the first cycle:  {figures.series_before}")
    print(f"series served after the last cycle:    {figures.series_after}")
    print(f"most series in one scrape:             {figures.most_series}")
    print(f"most cap-gauge series in one scrape:   {figures.most_cap_series}")
    print(f"distinct cap-gauge series over the run: {figures.distinct_cap_series}")
    print(f"pods seen as owners:                   {figures.owners_seen}")
    print(f"fold + scrape per cycle:               {elapsed / args.cycles * 1000:.2f} ms")


if __name__ == "__main__":
    main()
