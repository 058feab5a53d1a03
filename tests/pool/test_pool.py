"""agent/sim/pool.py: many simulated node agents on one cycle thread -- the staggered schedule,
the faults each node is hit by, and that no node's fault or cycle touches another's state."""

from __future__ import annotations

import pytest

from capwatch.agent.reports import Outcome, Reason
from capwatch.agent.sim.pool import WRITE_LOG, PoolNode, PoolSettings
from capwatch.agent.sim.poolspec import PoolFaultKind, parse_fault
from capwatch.kit.clock import FakeClock
from tests.pool.support import run_pool_for

NONE: frozenset[PoolFaultKind] = frozenset()


def test_first_cycles_are_staggered_across_the_interval_then_one_interval_apart() -> None:
    """Node i of n first cycles i/n of an interval after the start, and each node sleeps one
    interval after each of its cycles (in fake time: exactly)."""
    pool, ran = run_pool_for(3.9, nodes=4, interval_s=1.0)
    for i, name in enumerate(pool.names()):
        times = [r.at for r in ran.of(name)]
        assert times == pytest.approx([i / 4 + k for k in range(4)]), name
    assert [r.node for r in ran.cycles[:4]] == list(pool.names())
    assert pool.cycles == 16
    assert pool.skipped == 0


def test_write_failed_fails_only_the_hit_nodes_cycles_and_only_in_its_window() -> None:
    """write_failed:0.5@2+3 fails GPU 0's cap write (write_failed, no_permission) on the nodes
    the fault hits, for the cycles that start inside [2, 5); every other cycle, and every
    cycle of the other nodes, is enforced."""
    fault = "write_failed:0.5@2+3"
    pool, ran = run_pool_for(8, nodes=12, interval_s=1.0, faults=(fault,))
    hit = {n for n in pool.names() if parse_fault("--fault", fault).hits(n)}
    assert 0 < len(hit) < 12  # both kinds of node are in the test
    for r in ran.cycles:
        inside = r.node in hit and 2 <= r.at < 5
        assert r.report.enforced is not inside, (r.node, r.at)
        if inside:
            first, *rest = r.report.gpus
            assert (first.outcome, first.reason) == (Outcome.FAILED, Reason.WRITE_FAILED)
            assert first.error_class is not None
            assert first.error_class.value == "no_permission"
            assert all(g.outcome is Outcome.ENFORCED for g in rest)
    assert {c.node for c in ran.changes} == hit
    for node in hit:
        kinds = [c.kinds for c in ran.changes if c.node == node]
        assert kinds == [frozenset({PoolFaultKind.WRITE_FAILED}), NONE]


@pytest.mark.parametrize("kind", [PoolFaultKind.HANG, PoolFaultKind.SILENT, PoolFaultKind.VANISH])
def test_hang_silent_and_vanish_skip_the_hit_nodes_cycles_in_their_window(
    kind: PoolFaultKind,
) -> None:
    """A hit node completes no cycle while the window is open (nothing is published, its
    sequence stands still) and cycles again once it closes; the listener hears the fault
    come and go; the other nodes cycle throughout."""
    fault = f"{kind.value}:0.5@2+3"
    pool, ran = run_pool_for(8, nodes=12, interval_s=1.0, faults=(fault,))
    hit = {n for n in pool.names() if parse_fault("--fault", fault).hits(n)}
    assert 0 < len(hit) < 12
    for name in pool.names():
        times = [r.at for r in ran.of(name)]
        offset = pool.names().index(name) / 12
        every = [offset + k for k in range(8)]
        expected = [t for t in every if not 2 <= t < 5] if name in hit else every
        assert times == pytest.approx(expected), name
        # Sequences count the cycles the node completed, with no gap.
        assert [r.report.sequence for r in ran.of(name)] == list(range(1, len(times) + 1))
        assert pool.nodes[name].hub.state().sequence == len(times)
    assert pool.skipped == 3 * len(hit)
    for node in hit:
        assert [c.kinds for c in ran.changes if c.node == node] == [frozenset({kind}), NONE]


def test_a_node_sees_only_the_faults_that_hit_it() -> None:
    """Each node keeps the scheduled faults that hit it, decided once, and its active kinds
    are those whose window is open."""
    settings = PoolSettings(
        nodes=1,
        gpus=1,
        interval_s=1.0,
        faults=(parse_fault("--fault", "hang:1@5+5"), parse_fault("--fault", "silent:1@7+5")),
    )
    node = PoolNode("n-0", settings=settings, clock=FakeClock())
    assert node.active(0) == NONE
    assert node.active(6) == {PoolFaultKind.HANG}
    assert node.active(8) == {PoolFaultKind.HANG, PoolFaultKind.SILENT}
    assert node.active(11) == {PoolFaultKind.SILENT}
    rare = parse_fault("--fault", "hang:0.000001@0+5")
    assert not rare.hits("n-0")
    missed = PoolSettings(nodes=1, interval_s=1.0, faults=(rare,))
    assert PoolNode("n-0", settings=missed, clock=FakeClock()).faults == ()


def test_one_nodes_fault_never_touches_another_nodes_state_or_sequence() -> None:
    """Two nodes of one pool, one failing every write: each has its own agent instance,
    sequence, readiness, device table, ownership record and simulated GPUs; the healthy
    node's reports and GPUs are exactly those of a node with no fault."""
    clock = FakeClock()
    settings = PoolSettings(nodes=3, gpus=2, interval_s=1.0)
    sick, well, alone = (PoolNode(f"n-{i}", settings=settings, clock=clock) for i in range(3))
    failing = frozenset({PoolFaultKind.WRITE_FAILED})
    for _ in range(3):
        assert sick.cycle(failing) is not None
        clock.advance(1.0)
    for _ in range(2):
        assert well.cycle(NONE) is not None
        assert alone.cycle(NONE) is not None
    assert (sick.hub.state().sequence, well.hub.state().sequence) == (3, 2)
    assert sick.hub.instance_id != well.hub.instance_id
    assert not sick.hub.readiness().ready
    assert well.hub.readiness().ready
    latest = well.hub.state().latest
    assert latest is not None
    assert latest.enforced
    assert [(g.outcome, g.applied_watts) for g in latest.gpus] == [
        (g.outcome, g.applied_watts)
        for g in alone.hub.state().latest.gpus  # type: ignore[union-attr]
    ]
    assert all(w.outcome.value == "ok" for w in well.world.writes())
    assert any(w.outcome.value != "ok" for w in sick.world.writes())
    # Each node's world has its own GPUs: the failing node's UUIDs are nowhere else.
    sick_uuids = {g.uuid for g in sick.world.scenario.gpus}
    assert sick_uuids.isdisjoint(g.uuid for g in well.world.scenario.gpus)
    # And its own ownership record: the GPUs it capped, none of the other node's.
    assert set(well.store.records()) == {g.uuid for g in well.world.scenario.gpus}
    assert set(sick.store.records()) <= sick_uuids


def test_a_write_fault_ends_when_its_window_does() -> None:
    """After write_failed the node's next cycle writes again and is enforced (the fault is
    removed from its world, not left behind)."""
    clock = FakeClock()
    node = PoolNode("n-0", settings=PoolSettings(nodes=1, gpus=2, interval_s=1.0), clock=clock)
    report = node.cycle(frozenset({PoolFaultKind.WRITE_FAILED}))
    assert report is not None
    assert not report.enforced
    report = node.cycle(NONE)
    assert report is not None
    assert report.enforced
    assert node.hub.readiness().ready


def test_a_long_running_node_holds_a_bounded_write_log() -> None:
    """Every cycle writes every GPU: a node of a pool that runs for hours must not keep
    every write it ever made (5,000 nodes x 8 GPUs every 15 s is 2,667 a second); it keeps
    the latest few, newest last."""
    clock = FakeClock()
    node = PoolNode("n-0", settings=PoolSettings(nodes=1, gpus=2, interval_s=1.0), clock=clock)
    for _ in range(200):
        node.cycle(NONE)
    writes = node.world.writes()
    assert 0 < len(writes) <= WRITE_LOG
    assert writes[-1].cycle == node.hub.state().sequence
