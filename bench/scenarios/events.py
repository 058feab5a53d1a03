"""What a flood of device events costs the cycle that drains it, against a quiet cycle.

The unit tests pin what a flood becomes (one entry with its count, at most
EVENT_KEYS_LIMIT entries, the excess counted); this prints what it costs, as
ratios against baselines measured in the same run:

* the NVML event thread's cost per event: 10,000 ``add`` calls of one XID,
  against the least an aggregator can do (a dict increment under a lock);
* ``drain()`` of the event accumulator after 10,000 XIDs of one code, and after
  more distinct codes than it keeps (EVENT_KEYS_LIMIT + 200), against a drain
  after a single event;
* a whole reconcile cycle (the benches' node, bench/rigs/node.py, on the
  simulator, with the in-memory pod view) that drains such a flood, against the same cycle with no
  events. The events are added before each timed cycle: adding them is the
  event thread's cost (the first figure), not the cycle's. A flood of one code
  is a single entry however it was added, so it goes in as one ``add`` with
  its count; distinct codes go in one ``add`` each.

Three nodes of their own (quiet, one code, distinct codes) take turns, cycle by
cycle, in an order that rotates, so a busy spell of the machine falls on all
three alike; the garbage collector runs between rounds, never inside a timed
call. Expected: the one-code ratios near 1 (no
per-event work on the cycle); the distinct-code ones above 1 but bounded, since
the accumulator keeps EVENT_KEYS_LIMIT entries at most.

Run: ``.venv/bin/python -m bench.scenarios.events`` (about half a minute).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bench.rigs.node import GPUS, PODS, build_world, memory_pods, reconciler_for
from bench.shared.stats import p99
from capwatch.agent.dra.claims import NoClaims
from capwatch.agent.health.telemetry import EVENT_KEYS_LIMIT, DeviceEventKind, EventAccumulator
from capwatch.agent.reconciling import Reconciler
from capwatch.agent.sim.world import SimWorld

FLOOD = 10_000
DISTINCT = EVENT_KEYS_LIMIT + 200
XID = DeviceEventKind.XID
GPU = 1  # the GPU the events are on

Fill = Callable[[EventAccumulator], None]


def no_events(events: EventAccumulator) -> None:
    return None


def one_event(events: EventAccumulator) -> None:
    events.add(XID, index=GPU, uuid=None, code=79)


def one_code(events: EventAccumulator) -> None:
    events.add(XID, index=GPU, uuid=None, code=79, count=FLOOD)


def distinct_codes(events: EventAccumulator) -> None:
    for code in range(DISTINCT):
        events.add(XID, index=GPU, uuid=None, code=code)


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """A collection in the middle of a timed call would be charged to it: collect only
    where :func:`rounds` says, between rounds."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def rounds(count: int, kinds: dict[str, Fill]) -> Iterator[list[tuple[str, Fill]]]:
    """``count`` rounds of every kind, the order rotated each round, collected between."""
    items = list(kinds.items())
    for n in range(count):
        gc.collect()
        yield items[n % len(items) :] + items[: n % len(items)]


def time_adds(count: int) -> dict[str, list[float]]:
    """Microseconds per event for FLOOD events of one code, added one at a time."""
    bare, real = "dict increment under a lock", "EventAccumulator.add"
    samples: dict[str, list[float]] = {bare: [], real: []}
    key = (GPU, None, XID, 79)
    with no_gc():
        for _ in range(count):
            gc.collect()
            lock, counts = threading.Lock(), {key: 0}
            start = time.perf_counter()
            for _ in range(FLOOD):
                with lock:
                    counts[key] = counts.get(key, 0) + 1
            samples[bare].append((time.perf_counter() - start) * 1e6 / FLOOD)
            events = EventAccumulator()
            start = time.perf_counter()
            for _ in range(FLOOD):
                events.add(XID, index=GPU, uuid=None, code=79)
            samples[real].append((time.perf_counter() - start) * 1e6 / FLOOD)
            assert [e.count for e in events.drain()] == [FLOOD]
    return samples


def time_drains(count: int) -> dict[str, list[float]]:
    """Microseconds per ``drain()`` after each way of filling the accumulator, alternated."""
    fills: dict[str, Fill] = {
        "one event": one_event,
        f"{FLOOD:,} XIDs, one code": one_code,
        f"{DISTINCT:,} distinct codes": distinct_codes,
    }
    samples: dict[str, list[float]] = {name: [] for name in fills}
    with no_gc():
        for order in rounds(count, fills):
            for name, fill in order:
                events = EventAccumulator()
                fill(events)
                start = time.perf_counter()
                drained = events.drain()
                samples[name].append((time.perf_counter() - start) * 1e6)
                assert 1 <= len(drained) <= EVENT_KEYS_LIMIT
                del drained  # freed here, not inside the next timed drain
    return samples


def time_cycles(cycles: int) -> dict[str, list[float]]:
    """Milliseconds per reconcile cycle on three nodes, the events before each, alternated."""
    fills: dict[str, Fill] = {
        "no events": no_events,
        f"{FLOOD:,} XIDs, one code": one_code,
        f"{DISTINCT:,} distinct codes": distinct_codes,
    }
    pods = memory_pods()
    samples: dict[str, list[float]] = {name: [] for name in fills}
    with tempfile.TemporaryDirectory() as tmp:
        nodes: dict[str, tuple[SimWorld, Reconciler]] = {}
        for n, name in enumerate(fills):
            root = Path(tmp) / f"node-{n}"
            world = build_world(root / "proc")
            reconciler = reconciler_for(world, pods, NoClaims(), root / "proc", root / "state")
            nodes[name] = (world, reconciler)
        for _ in range(20):  # warm-up: the first cycles claim the GPUs and write the record
            for _world, reconciler in nodes.values():
                assert reconciler.reconcile_once().enforced
        with no_gc():
            for order in rounds(cycles, fills):
                for name, fill in order:
                    world, reconciler = nodes[name]
                    fill(world.devices.events)
                    start = time.perf_counter()
                    report = reconciler.reconcile_once()
                    samples[name].append((time.perf_counter() - start) * 1000)
                    assert len(report.events) <= EVENT_KEYS_LIMIT, len(report.events)
                    del report  # freed here, not inside the next timed cycle
    return samples


def print_ratios(title: str, unit: str, samples: dict[str, list[float]]) -> None:
    """Median and p99 of each kind, and its median's ratio to the first kind's."""
    names = list(samples)
    base = statistics.median(samples[names[0]])
    print(title)
    for name in names:
        median = statistics.median(samples[name])
        tail = p99(samples[name])
        print(
            f"  {name:<28} median {median:9.3f} {unit}  p99 {tail:9.3f} {unit}"
            f"  ratio {median / base:6.2f}x"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adds", type=int, default=20, help=f"rounds of {FLOOD:,} adds")
    parser.add_argument("--drains", type=int, default=300, help="drains of each kind")
    parser.add_argument("--cycles", type=int, default=300, help="cycles of each kind")
    args = parser.parse_args()
    # Every distinct-code drain drops what is past EVENT_KEYS_LIMIT, and says so.
    logging.getLogger("capwatch.agent.health.telemetry").setLevel(logging.ERROR)
    print(
        f"capwatch device-event benchmark: {GPUS} GPUs, {PODS} pods, "
        f"EVENT_KEYS_LIMIT {EVENT_KEYS_LIMIT}, Python {sys.version.split()[0]}"
    )
    print_ratios(
        f"event thread, per event, {args.adds} rounds of {FLOOD:,} (ratio to the bare increment):",
        "us",
        time_adds(args.adds),
    )
    print_ratios(
        f"drain() of the event accumulator, {args.drains} of each (ratio to one event):",
        "us",
        time_drains(args.drains),
    )
    print_ratios(
        f"reconcile cycle draining them, {args.cycles} of each (ratio to no events):",
        "ms",
        time_cycles(args.cycles),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
