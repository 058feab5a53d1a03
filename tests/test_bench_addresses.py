"""The cluster bench's one-address-per-node shape: every node a pod IP of its own."""

from __future__ import annotations

import ipaddress

import pytest

from bench.shared.addresses import MAX_NODES, node_address


def test_every_node_gets_a_distinct_valid_loopback_address() -> None:
    """Up to the limit each index maps to a distinct address inside 127.0.0.0/8, the first
    host of its own /24 (5,000 nodes once gave 127.16.0.256, which no pool could bind)."""
    addresses = [ipaddress.ip_address(node_address(i)) for i in range(MAX_NODES)]
    assert len(set(addresses)) == MAX_NODES
    assert all(a in ipaddress.ip_network("127.64.0.0/10") for a in addresses)
    networks = {ipaddress.ip_network(f"{a}/24", strict=False) for a in addresses}
    assert len(networks) == MAX_NODES


def test_past_the_limit_is_refused() -> None:
    """An index the pod networks cannot hold is an error, not a wrapped address."""
    with pytest.raises(ValueError, match="16384"):
        node_address(MAX_NODES)
