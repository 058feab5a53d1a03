"""Addresses on this machine's loopback: a free port, and each node's own address.

The nodes' pod networks are a /24 per node from 127.64.0.0/10 (as the KWOK cluster's,
tests/realkube/kwok_cluster.py), so a bench can give every node an address of its own,
as a real cluster's pod IPs are: 16,384 nodes at most.
"""

from __future__ import annotations

import socket

MAX_NODES = 64 * 256


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (just freed: the next best thing for a process that
    refuses port 0, as the shim does)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def node_address(index: int) -> str:
    """Node ``index``'s own loopback address, the first of its /24 as a pod IP would be:
    127.64.0.1, 127.64.1.1, ..., 127.64.255.1, 127.65.0.1, ..."""
    if not 0 <= index < MAX_NODES:
        raise ValueError(f"node index {index}: one address per node holds {MAX_NODES} nodes")
    return f"127.{64 + index // 256}.{index % 256}.1"
