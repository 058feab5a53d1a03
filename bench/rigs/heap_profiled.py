"""Run a Python module with its allocations traced; on SIGUSR1, write where its heap is.

``python -m bench.rigs.heap_profiled OUT -m MODULE ARGS...`` starts tracemalloc (four
frames a trace) before MODULE is imported, then runs it as ``__main__``. On SIGUSR1 it
writes OUT (JSON, then renamed into place, so a reader never sees half of it):

- ``rss_mib``: the process's resident set now; ``traced_mib``: what Python allocated
  and still holds (tracemalloc's total). The difference is what Python does not
  allocate itself: grpc core's connections, the C libraries', the allocators' slack;
- ``owners``: the top files by the memory their lines allocated and still hold (the
  allocating line is the innermost frame; a line in the standard library or a
  package is charged to the first capwatch frame above it, if any, so that asyncio's
  ``Task`` is charged to the module that created it);
- ``types``: the top types among the objects the garbage collector tracks (containers:
  dicts, lists, instances; strings and numbers are not tracked), by count and shallow
  size.

A bench tool: tracing slows the process and costs memory of its own, so a run taken
with it gives the shape of the heap, never the figures (bench/scenarios/heap.py runs the
controller under it; cluster.py and kwok.py take the figures).
"""

from __future__ import annotations

import collections
import gc
import json
import os
import runpy
import signal
import sys
import tracemalloc
from pathlib import Path
from types import FrameType

from bench.shared.procs import rss_mib

FRAMES = 4
TOP = 25
ROOT = Path(__file__).resolve().parents[2]
# capwatch's own files, by the name they are imported under (capwatch/, whose rooms are
# links to the repository's folders) or by the folder itself.
OURS = tuple(
    str(ROOT / room)
    for room in ("capwatch", "agent", "api", "client", "controller", "kit", "kube", "server")
)


def _owner(trace: tracemalloc.Traceback) -> str:
    """The capwatch file nearest the allocation, else the allocating file itself."""
    for frame in trace:  # innermost first
        if frame.filename.startswith(OURS):
            return os.path.relpath(frame.filename, ROOT)
    return _short(trace[0].filename)


def _short(filename: str) -> str:
    marker = "site-packages/"
    if marker in filename:
        return filename.split(marker, 1)[1]
    if filename.startswith(str(ROOT)):
        return os.path.relpath(filename, ROOT)
    return filename.rsplit("/lib/python3", 1)[-1].split("/", 1)[-1]


def profile() -> dict[str, object]:
    snapshot = tracemalloc.take_snapshot()
    owners: collections.Counter[str] = collections.Counter()
    for stat in snapshot.statistics("traceback"):
        owners[_owner(stat.traceback)] += stat.size
    counts: collections.Counter[str] = collections.Counter()
    sizes: collections.Counter[str] = collections.Counter()
    for obj in gc.get_objects():
        kind = type(obj)
        name = f"{kind.__module__}.{kind.__qualname__}"
        counts[name] += 1
        sizes[name] += sys.getsizeof(obj)
    traced, _ = tracemalloc.get_traced_memory()
    return {
        "rss_mib": round(rss_mib("self"), 1),
        "traced_mib": round(traced / 2**20, 1),
        "owners": [
            {"file": name, "mib": round(size / 2**20, 2)} for name, size in owners.most_common(TOP)
        ],
        "types": [
            {"type": name, "count": counts[name], "mib": round(size / 2**20, 2)}
            for name, size in sizes.most_common(TOP)
        ],
    }


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "-m":
        print("usage: python -m bench.rigs.heap_profiled OUT -m MODULE ARGS...", file=sys.stderr)
        return 2
    out, module, rest = Path(argv[0]), argv[2], argv[3:]

    def write(_signum: int, _frame: FrameType | None) -> None:
        partial = out.with_suffix(".partial")
        partial.write_text(json.dumps(profile(), indent=1))
        partial.replace(out)

    signal.signal(signal.SIGUSR1, write)
    tracemalloc.start(FRAMES)
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
