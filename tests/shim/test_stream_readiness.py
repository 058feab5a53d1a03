"""The shim's readiness: agent-reported ages plus the shim's own monotonic time."""

from __future__ import annotations

from google.protobuf.duration_pb2 import Duration

from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.client.stream_readiness import StreamReadiness
from capwatch.kit.readiness import ReadinessReason

STALE_AFTER = 45.0


def dur(seconds: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def cycle(seq: int, *, enforced: bool = True, age: float = 0.0) -> pb.CycleReport:
    readiness = pb.Readiness(last_cycle_age=dur(age))
    if enforced:
        readiness.last_good_cycle_age.CopyFrom(dur(age))
    return pb.CycleReport(
        sequence=seq,
        enforced=enforced,
        readiness=readiness,
        failure_summary="" if enforced else "gpu0:write_failed",
    )


def snapshot(last: pb.CycleReport | None = None) -> pb.NodeSnapshot:
    snap = pb.NodeSnapshot(stale_after=dur(STALE_AFTER))
    if last is not None:
        snap.last_cycle.CopyFrom(last)
        snap.readiness.CopyFrom(last.readiness)
    return snap


def test_not_ready_before_the_first_good_cycle_then_ready():
    """503 before any cycle (no-cycle-yet), 200 right after an enforced one."""
    tracker = StreamReadiness()
    assert tracker.evaluate(0).reason is ReadinessReason.NO_CYCLE_YET
    tracker.on_snapshot(snapshot(), received_at=0)
    assert tracker.evaluate(1).reason is ReadinessReason.NO_CYCLE_YET
    tracker.on_cycle(cycle(1), received_at=2)
    assert tracker.evaluate(2).ready


def test_age_is_agent_age_plus_own_monotonic_time():
    """The staleness bound counts the age at send plus the time since receipt."""
    tracker = StreamReadiness()
    tracker.on_snapshot(snapshot(cycle(1, age=40.0)), received_at=100.0)
    assert tracker.evaluate(104.9).ready
    assert tracker.evaluate(105.0).reason is ReadinessReason.STALE


def test_failed_cycle_is_not_ready_on_the_next_poll():
    """A failed cycle flips readiness at once, with the failure in the detail."""
    tracker = StreamReadiness()
    tracker.on_snapshot(snapshot(cycle(1)), received_at=0)
    tracker.on_cycle(cycle(2, enforced=False), received_at=1)
    readiness = tracker.evaluate(1.001)
    assert readiness.reason is ReadinessReason.CYCLE_FAILED
    assert readiness.text == "cycle-failed: gpu0:write_failed"


def test_heartbeats_carry_a_hung_cycle_into_staleness():
    """With no new cycle, heartbeats report a growing age and readiness goes stale."""
    tracker = StreamReadiness()
    tracker.on_snapshot(snapshot(cycle(1)), received_at=0)
    tracker.on_heartbeat(
        pb.Heartbeat(readiness=pb.Readiness(last_cycle_age=dur(46.0))), received_at=46.0
    )
    assert tracker.evaluate(46.0).reason is ReadinessReason.STALE


def test_stream_loss_fails_closed_until_a_fresh_good_cycle():
    """Lost stream: 503 at once; a reconnect snapshot is not enough; a good cycle is."""
    tracker = StreamReadiness()
    tracker.on_snapshot(snapshot(cycle(1)), received_at=0)
    assert tracker.evaluate(1).ready
    tracker.on_lost()
    assert tracker.evaluate(1).reason is ReadinessReason.STREAM_LOST
    tracker.on_snapshot(snapshot(cycle(1, age=1.0)), received_at=2)
    assert tracker.evaluate(2).reason is ReadinessReason.STREAM_LOST
    tracker.on_cycle(cycle(2, enforced=False), received_at=3)
    assert tracker.evaluate(3).reason is ReadinessReason.STREAM_LOST
    tracker.on_cycle(cycle(3), received_at=4)
    assert tracker.evaluate(4).ready


def test_wall_clock_plays_no_part():
    """Only monotonic receipt times and agent-reported durations are used: the messages'
    wall-clock timestamps may jump anywhere without effect."""
    tracker = StreamReadiness()
    first = cycle(1)
    first.finished.FromSeconds(4_000_000_000)  # far future wall time
    tracker.on_snapshot(snapshot(first), received_at=10)
    assert tracker.evaluate(11).ready
    second = cycle(2)
    second.finished.FromSeconds(0)  # wall clock stepped back to 1970
    tracker.on_cycle(second, received_at=20)
    assert tracker.evaluate(21).ready
    assert tracker.evaluate(20 + STALE_AFTER).reason is ReadinessReason.STALE
