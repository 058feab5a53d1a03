"""agent/sim/poolspec.py: the fault schedule's syntax and windows, which nodes a fault hits, and
each node's generated scenario."""

from __future__ import annotations

import pytest

from capwatch.agent.sim.poolspec import (
    PoolFault,
    PoolFaultKind,
    node_names,
    node_scenario,
    parse_fault,
)
from capwatch.kit.errors import ConfigError

NAMES = node_names(10_000, prefix="sim-node-")


def test_a_fault_parses_with_and_without_a_period() -> None:
    """KIND:FRACTION@START+DURATION[/EVERY], spaces around it ignored; the slot is kept."""
    assert parse_fault("--fault", " write_failed:0.1@60+30/300 ", slot=2) == PoolFault(
        kind=PoolFaultKind.WRITE_FAILED,
        fraction=0.1,
        start_s=60.0,
        duration_s=30.0,
        every_s=300.0,
        slot=2,
    )
    assert parse_fault("--fault", "vanish:1@0+2.5") == PoolFault(
        kind=PoolFaultKind.VANISH, fraction=1.0, start_s=0.0, duration_s=2.5
    )
    for kind in PoolFaultKind:
        assert parse_fault("--fault", f"{kind.value}:0.5@1+1").kind is kind


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            "write_failed",
            "expected KIND:FRACTION@START+DURATION[/EVERY] (e.g. write_failed:0.1@60+30/300), "
            "got 'write_failed'",
        ),
        (
            "write_failed:0.1@60",
            "expected KIND:FRACTION@START+DURATION[/EVERY] (e.g. write_failed:0.1@60+30/300), "
            "got 'write_failed:0.1@60'",
        ),
        (
            "write_failed:-0.1@1+1",
            "expected KIND:FRACTION@START+DURATION[/EVERY] (e.g. write_failed:0.1@60+30/300), "
            "got 'write_failed:-0.1@1+1'",
        ),
        (
            "explode:0.1@1+1",
            "unknown fault 'explode' (one of write_failed, hang, silent, vanish)",
        ),
        ("write_failed:0.1.2@1+1", "not a number in 'write_failed:0.1.2@1+1'"),
        ("hang:.@1+1", "not a number in 'hang:.@1+1'"),
        ("silent:0@1+1", "the fraction must be in (0, 1], got 0"),
        ("silent:1.5@1+1", "the fraction must be in (0, 1], got 1.5"),
        ("hang:0.5@1+0", "the duration must be positive"),
        ("hang:0.5@1+10/10", "/EVERY (10s) must be longer than the duration"),
        ("hang:0.5@1+10/0", "/EVERY (0s) must be longer than the duration"),
    ],
)
def test_a_bad_fault_is_one_clear_config_error(text: str, reason: str) -> None:
    """Every malformed schedule entry raises one ConfigError naming the flag, saying what is
    wrong with it (no ValueError, no traceback)."""
    with pytest.raises(ConfigError) as raised:
        parse_fault("--fault", text)
    assert raised.value.option == "--fault"
    assert raised.value.reason == reason
    assert str(raised.value) == f"--fault: {reason}"


def test_a_window_opens_at_start_and_closes_at_start_plus_duration() -> None:
    """[START, START+DURATION): open at its start, closed at its end, and never before."""
    fault = parse_fault("--fault", "hang:1@10+5")
    assert [fault.active(t) for t in (0, 9.999, 10, 12, 14.999, 15, 100)] == [
        False,
        False,
        True,
        True,
        True,
        False,
        False,
    ]


def test_a_periodic_window_opens_again_every_period() -> None:
    """With /EVERY the window repeats from its start: [10,15), [40,45), [70,75), ..."""
    fault = parse_fault("--fault", "hang:1@10+5/30")
    opened = [t for t in range(100) if fault.active(t)]
    assert opened == [10, 11, 12, 13, 14, 40, 41, 42, 43, 44, 70, 71, 72, 73, 74]


@pytest.mark.parametrize("fraction", [0.05, 0.2, 0.5, 0.9])
def test_a_fault_hits_about_its_fraction_of_the_nodes(fraction: float) -> None:
    """Over 10,000 node names the share hit is the fraction, within two points."""
    fault = parse_fault("--fault", f"write_failed:{fraction}@0+1")
    hit = sum(fault.hits(name) for name in NAMES) / len(NAMES)
    assert hit == pytest.approx(fraction, abs=0.02)


def test_which_nodes_a_fault_hits_is_decided_by_name_and_slot_alone() -> None:
    """The same fault in the same place hits the same nodes every time (a restarted pool fails
    the same nodes); whatever its kind or window; a whole fraction hits every node."""
    first = parse_fault("--fault", "write_failed:0.3@0+1", slot=1)
    again = parse_fault("--fault", "hang:0.3@50+7/100", slot=1)
    assert [first.hits(n) for n in NAMES] == [again.hits(n) for n in NAMES]
    assert all(parse_fault("--fault", "silent:1@0+1").hits(n) for n in NAMES)


def test_faults_in_different_places_hit_different_nodes() -> None:
    """Two faults of one fraction in different slots hit about independent sets (the overlap
    is about fraction squared, not the whole fraction)."""
    one = parse_fault("--fault", "write_failed:0.3@0+1", slot=0)
    two = parse_fault("--fault", "write_failed:0.3@0+1", slot=1)
    both = sum(one.hits(n) and two.hits(n) for n in NAMES) / len(NAMES)
    assert both == pytest.approx(0.09, abs=0.02)


def test_node_names_are_unpadded_so_several_pools_name_one_cluster() -> None:
    """Names are the prefix and the plain number, from the first index: two pools of a
    cluster (0-99 and 100-199) name their nodes exactly as one pool of 200 would."""
    assert node_names(3, prefix="n-") == ("n-0", "n-1", "n-2")
    assert node_names(3, prefix="n-", first=98) == ("n-98", "n-99", "n-100")
    assert node_names(100, prefix="n-") + node_names(100, prefix="n-", first=100) == node_names(
        200, prefix="n-"
    )


def test_a_node_scenario_is_busy_capped_and_the_same_for_the_same_name() -> None:
    """Every GPU runs one process of its own pod asking for a cap; the UUIDs derive from the
    node's name (a restarted pool reports the same devices), and differ between nodes."""
    scenario = node_scenario("sim-node-7", gpus=3)
    assert scenario.node_name == "sim-node-7"
    assert [p.gpu for p in scenario.processes] == [0, 1, 2]
    pods = {pod.uid: pod for pod in scenario.pods}
    assert all(p.pod in pods for p in scenario.processes)
    assert all("capwatch.io/gpu-power-limit" in pod.annotations for pod in scenario.pods)
    assert node_scenario("sim-node-7", gpus=3).gpus == scenario.gpus
    other = {g.uuid for g in node_scenario("sim-node-8", gpus=3).gpus}
    assert other.isdisjoint(g.uuid for g in scenario.gpus)
