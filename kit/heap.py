"""The heap a long-running command settles once it has started.

A full (generation 2) pass of Python's cyclic collector walks every tracked
object and holds the event loop while it does: in an agent serving 1,000
Watch streams, 25-55 ms in which no stream sends, and bench/scenarios/stream.py finds
nearly every fan-out delivery over the p99 in a cycle during which such a
pass began. Most of what the pass walks was made at start-up (modules, grpc,
protobuf descriptors, the server itself) and lives as long as the process:
frozen, the collector skips it from then on. Whatever is made later is
collected as before; frozen objects are still freed when their last
reference goes, only a cycle among them would never be.
"""

from __future__ import annotations

import gc


def settle_heap() -> int:
    """Collect once, then move every object alive out of the cyclic collector's reach.

    Returns how many objects are frozen now."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
