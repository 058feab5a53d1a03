"""Shard assignment (controller/sharding.py): FNV-1a 64 of the node name, jump consistent
hash over the shard count, and the StatefulSet ordinal a replica's default shard comes from."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from capwatch.controller.sharding import fnv1a64, ordinal, shard_of
from capwatch.kit.errors import ConfigError

NODES = [f"gpu-node-{i:05d}.pool-{i % 7}.example.internal" for i in range(10_000)]
_MASK64 = 0xFFFFFFFFFFFFFFFF


def reference_jump(key: int, buckets: int) -> int:
    """Lamping and Veach's published algorithm, transcribed: the check on the C library."""
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & _MASK64
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", 0xCBF29CE484222325),
        (b"a", 0xAF63DC4C8601EC8C),
        (b"foobar", 0x85944171F73967E8),
        (b"hello", 0xA430D84680AABD0B),
    ],
)
def test_fnv1a64_matches_the_published_vectors(data: bytes, expected: int) -> None:
    """fnv1a64 is FNV-1a with the 64-bit offset basis and prime (the reference vectors)."""
    assert fnv1a64(data) == expected


def test_fnv1a64_stays_within_64_bits() -> None:
    """Long inputs wrap modulo 2**64 (the multiply is masked every byte)."""
    for name in NODES[:200]:
        assert 0 <= fnv1a64(name.encode() * 50) <= _MASK64


@pytest.mark.parametrize("shards", [1, 2, 3, 5, 8, 64])
def test_shard_of_is_jump_hash_of_fnv1a64(shards: int) -> None:
    """shard_of(name, N) is exactly jump(fnv1a64(name), N) as the paper defines it."""
    for name in NODES[:2000]:
        assert shard_of(name, shards) == reference_jump(fnv1a64(name.encode()), shards)


def test_shard_of_is_in_range_and_uses_every_shard() -> None:
    """Every name lands in [0, N), and 10,000 names spread over all N shards, evenly."""
    for shards in (1, 2, 3, 7, 16):
        counts = [0] * shards
        for name in NODES:
            shard = shard_of(name, shards)
            assert 0 <= shard < shards
            counts[shard] += 1
        expected = len(NODES) / shards
        assert all(0.85 * expected <= count <= 1.15 * expected for count in counts), counts


def test_shard_of_is_the_same_in_another_process() -> None:
    """No salted hash(): a process with another PYTHONHASHSEED assigns the same shards."""
    names = NODES[:50]
    code = (
        "import sys; from capwatch.controller.sharding import shard_of; "
        "print(' '.join(str(shard_of(n, 5)) for n in sys.argv[1:]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, *names],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PYTHONPATH": str(Path(__file__).parents[2])},
        timeout=30,
    )
    assert result.stdout.split() == [str(shard_of(n, 5)) for n in names]


@pytest.mark.parametrize("shards", [0, -1])
def test_shard_of_refuses_fewer_than_one_shard(shards: int) -> None:
    """There is no shard of zero shards: a ValueError, not a crash deep in the C code."""
    with pytest.raises(ValueError, match="at least 1"):
        shard_of("gpu-1", shards)


def test_two_to_three_shards_moves_about_a_third_and_only_to_the_new_shard() -> None:
    """Resharding 2 -> 3 moves about 1/3 of the nodes, each to shard 2; none moves
    between the old shards (their streams stay up)."""
    moved = 0
    for name in NODES:
        before, after = shard_of(name, 2), shard_of(name, 3)
        if before != after:
            moved += 1
            assert after == 2, name
    assert 0.30 <= moved / len(NODES) <= 0.37


def test_growing_one_shard_at_a_time_moves_one_nth() -> None:
    """From N-1 to N shards, about 1/N of the nodes move, all to the new shard N-1."""
    for shards in (4, 8, 10):
        moved = [n for n in NODES if shard_of(n, shards - 1) != shard_of(n, shards)]
        assert all(shard_of(n, shards) == shards - 1 for n in moved)
        assert abs(len(moved) / len(NODES) - 1 / shards) < 0.03


def test_modulo_would_move_two_thirds() -> None:
    """The contrast the design cites: fnv1a64 % N moves ~2/3 of the nodes from 2 to 3
    shards (and between old shards too), twice what jump hashing moves."""
    keys = [fnv1a64(name.encode()) for name in NODES]
    moved_modulo = sum(1 for k in keys if k % 2 != k % 3) / len(keys)
    moved_jump = sum(1 for n in NODES if shard_of(n, 2) != shard_of(n, 3)) / len(NODES)
    between_old = sum(1 for k in keys if k % 2 != k % 3 and k % 3 != 2)
    assert moved_modulo > 0.6
    assert between_old > 0
    assert moved_modulo > 1.8 * moved_jump


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        ("capwatch-controller-0", 0),
        ("capwatch-controller-3", 3),
        ("capwatch-controller-12", 12),
        ("release-name-controller-007", 7),
    ],
)
def test_ordinal_is_the_number_after_the_last_dash(pod: str, expected: int) -> None:
    """A StatefulSet pod <set>-<ordinal> yields its ordinal."""
    assert ordinal(pod) == expected


@pytest.mark.parametrize(
    "pod",
    ["capwatch-controller", "capwatch-controller-", "capwatch-controller-x", "cw-3a", "", "3"],
)
def test_ordinal_of_a_name_without_one_is_a_config_error(pod: str) -> None:
    """A name with no trailing -<digits> is a ConfigError for --shard-index, quoting the name."""
    with pytest.raises(ConfigError) as caught:
        ordinal(pod)
    assert caught.value.option == "--shard-index"
    assert repr(pod) in caught.value.reason
