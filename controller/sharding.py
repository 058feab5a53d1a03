"""Which controller shard follows which node: jump consistent hash of FNV-1a 64.

A node belongs to shard ``jump(fnv1a64(node_name), shards)``. Jump consistent
hashing (Lamping and Veach, 2014) moves only about 1/N of the keys when the
number of buckets goes from N-1 to N, where ``hash % N`` would move nearly all
of them: resharding a controller from 2 to 3 shards hands a third of the nodes
to the new shard and leaves the rest where they were (their streams stay up).
FNV-1a turns the name into the 64-bit key; it is stable across processes and
Python versions (``hash()`` is salted per process) and cheap.
"""

from __future__ import annotations

import re

import jump

from capwatch.kit.errors import ConfigError

_FNV64_OFFSET = 0xCBF29CE484222325
_FNV64_PRIME = 0x100000001B3
_MASK64 = 0xFFFFFFFFFFFFFFFF
# A StatefulSet pod is <statefulset>-<ordinal>.
_ORDINAL = re.compile(r".*-([0-9]+)")


def fnv1a64(data: bytes) -> int:
    """FNV-1a, 64 bits (http://www.isthe.com/chongo/tech/comp/fnv/)."""
    value = _FNV64_OFFSET
    for byte in data:
        value = ((value ^ byte) * _FNV64_PRIME) & _MASK64
    return value


def shard_of(node_name: str, shards: int) -> int:
    """The shard, in ``[0, shards)``, that owns ``node_name``."""
    if shards < 1:
        raise ValueError(f"shards must be at least 1, got {shards}")
    return int(jump.hash(fnv1a64(node_name.encode()), shards))


def ordinal(pod_name: str) -> int:
    """The ordinal of a StatefulSet pod from its name (``capwatch-controller-3`` -> 3)."""
    match = _ORDINAL.fullmatch(pod_name)
    if match is None:
        raise ConfigError(
            "--shard-index", f"not given, and pod name {pod_name!r} has no StatefulSet ordinal"
        )
    return int(match.group(1))
