"""What ``capwatch watch`` shows while its stream is lost: one short line per reason, and on
a terminal the last picture greyed under a heading saying so, its ages counting on (the
printer alone, fed events by hand, on the events' own clock)."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import grpc
import pytest

from capwatch.api.gen.capwatch.v1 import cluster_health_pb2 as cpb
from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.client.stream_events import ClusterSnapshot, Cycle, Disconnected, Heartbeat, Snapshot
from capwatch.watch.layout import QUIET, Line, plain
from capwatch.watch.printer import Printer, disconnect_reason
from capwatch.watch.screen import PrintingScreen
from capwatch.watch.tables import Frame

TARGET = "127.0.0.1:50051"
REFUSED = (
    "UNAVAILABLE: failed to connect to all addresses; last error: UNKNOWN: "
    "ipv4:127.0.0.1:50051: Failed to connect to remote host: Connection refused"
)


class RecordingScreen:
    """A redrawing screen that keeps what it was given: every block shown, every note."""

    def __init__(self, width: int | None = 120) -> None:
        self.width = width
        self.blocks: list[tuple[Line, ...]] = []
        self.notes: list[str] = []

    redraws = True

    def show(self, frame: Frame) -> None:
        self.notes += [plain(line) for line in frame.notes]
        self.blocks.append(frame.block)

    def note(self, line: Line) -> None:
        self.notes.append(plain(line))

    def close(self) -> None:
        return

    @property
    def shown(self) -> list[str]:
        return [plain(line) for line in self.blocks[-1]]


def printer(screen: object | None = None, *, json: bool = False) -> tuple[Printer, io.StringIO]:
    err = io.StringIO()
    made = Printer(
        target=TARGET,
        json=json,
        since=0,
        out=io.StringIO(),
        err=err,
        screen=screen,  # type: ignore[arg-type]
    )
    return made, err


def lost(at: float, error: str = REFUSED, *, retry_in: float = 0.2, attempt: int = 0):
    """A Disconnected as the client makes it: OK for a stream the server ended, None for
    one it gave up on (silent), UNAVAILABLE for the rest."""
    code: grpc.StatusCode | None = grpc.StatusCode.UNAVAILABLE
    if error.startswith("stream ended"):
        code = grpc.StatusCode.OK
    elif error.startswith("no message for"):
        code = None
    return Disconnected(error=error, code=code, retry_in=retry_in, attempt=attempt, received_at=at)


def ready() -> pb.Readiness:
    readiness = pb.Readiness(ready=True, reason=pb.READINESS_REASON_READY)
    readiness.last_good_cycle_age.FromTimedelta(timedelta(seconds=0))
    return readiness


def enforced_cycle(at: float) -> Cycle:
    cycle = pb.CycleReport(
        sequence=7,
        enforced=True,
        abort_reason=pb.ABORT_REASON_NONE,
        readiness=ready(),
        devices=[pb.DeviceStatus(index=0, outcome=pb.OUTCOME_ENFORCED, reason="ok")],
    )
    return Cycle(cycle=cycle, received_at=at)


def test_a_lost_agent_stream_greys_the_table_and_counts_its_ages_on():
    """The agent goes away after an enforced, ready cycle: the heading says DISCONNECTED,
    for how long and why; the table below is the last one received, every segment
    dimmed; its "last good cycle" age counts on from when that cycle arrived (not "0.0s
    ago" for ever), and moves on with each redraw. The next message is the live picture
    again."""
    screen = RecordingScreen()
    watch, _ = printer(screen)
    watch.message(enforced_cycle(100.0))
    assert "ready, last good cycle 0.0s ago" in screen.shown[0]
    watch.disconnected(lost(115.0))
    heading, *rest = screen.shown
    assert heading.startswith("DISCONNECTED 0.0s  connection refused; retrying  below: ")
    assert rest[0].startswith("cycle 7  ")
    assert "ENFORCED" in rest[0]
    assert "ready, last good cycle 15.0s ago" in rest[0]
    assert rest[1].split()[:2] == ["GPU", "OUTCOME"]
    assert {style for line in screen.blocks[-1][1:] for _, style in line} == {QUIET}

    watch.refresh(121.5)
    assert screen.shown[0].startswith("DISCONNECTED 6.5s  ")
    assert "ready, last good cycle 21.5s ago" in screen.shown[1]

    watch.message(
        Heartbeat(heartbeat=pb.Heartbeat(last_sequence=7, readiness=ready()), received_at=130.0)
    )
    assert screen.shown[0].startswith("cycle 7  ")
    assert "reconnected to 127.0.0.1:50051" in screen.notes
    assert {style for line in screen.blocks[-1] for _, style in line} != {QUIET}
    watch.refresh(140.0)  # connected: nothing to redraw
    assert screen.shown[0].startswith("cycle 7  ")


def test_a_lost_cluster_stream_greys_every_node_and_ages_them_on():
    """The controller goes away: the cluster heading says DISCONNECTED (so "12 nodes: 12
    True" and every AGENT "connected" are no longer presented as live), every row is
    dimmed, and each node's age counts on from what was last received."""
    nodes = []
    for i in range(12):
        health = cpb.NodeHealth(
            node_name=f"sim-node-{i}",
            condition=cpb.NodeCondition(
                status=cpb.CONDITION_STATUS_TRUE, reason="CapsEnforced", message="ok"
            ),
            agent_link=cpb.AGENT_LINK_CONNECTED,
        )
        health.last_cycle_age.FromTimedelta(timedelta(seconds=0.5))
        nodes.append(health)
    snapshot = cpb.ClusterSnapshot(controller_instance_id="c0ffee", sequence=12, nodes=nodes)
    screen = RecordingScreen()
    watch, _ = printer(screen)
    watch.message(ClusterSnapshot(snapshot=snapshot, resync=False, restarted=False, received_at=50))
    watch.disconnected(lost(60.0))
    watch.refresh(80.0)
    heading, *rest = screen.shown
    assert heading.startswith("DISCONNECTED 20s  connection refused; retrying")
    assert "12 nodes: 12 True" in rest[0]
    rows = [line.split() for line in rest if line.startswith("  sim-node-")]
    assert [row[0] for row in rows] == [f"sim-node-{i}" for i in range(12)]
    assert {row[5] for row in rows} == {"30s"}  # 0.5 s when sent, 30 s since
    assert {style for line in screen.blocks[-1][1:] for _, style in line} == {QUIET}


def test_retries_print_one_short_line_per_reason():
    """Every retry is a Disconnected; only the first, and each whose reason differs from
    the last one printed, is a line, short (``disconnected: connection refused; retrying
    in 0.2s``), never grpc's whole status text. A reconnect starts afresh."""
    screen = RecordingScreen()
    watch, _ = printer(screen)
    watch.message(enforced_cycle(100.0))
    watch.disconnected(lost(101.0, "stream ended by the agent", retry_in=0.03))
    for attempt in range(1, 6):
        watch.disconnected(lost(101.0 + attempt, retry_in=0.2 * 2**attempt, attempt=attempt))
    watch.disconnected(lost(110.0, "no message for 31s; presuming the stream dead"))
    watch.message(enforced_cycle(120.0))
    watch.disconnected(lost(121.0, retry_in=0.2))
    assert [note for note in screen.notes if not note.startswith("cycle ")] == [
        "disconnected: stream ended by the agent; retrying in 0.03s",
        "disconnected: connection refused; retrying in 0.4s",
        "disconnected: no message for 31s; retrying in 0.2s",
        "reconnected to 127.0.0.1:50051",
        "disconnected: connection refused; retrying in 0.2s",
    ]


def test_json_keeps_stdout_json_and_says_each_reason_once_on_stderr():
    """--json: the lines about a lost stream go to stderr, once per reason, short; stdout
    has only the server's messages, one JSON object each (nothing greyed, no prose)."""
    out, err = io.StringIO(), io.StringIO()
    watch = Printer(target=TARGET, json=True, since=0, out=out, err=err)
    watch.message(enforced_cycle(100.0))
    for attempt in range(4):
        watch.disconnected(lost(101.0 + attempt, attempt=attempt))
    watch.refresh(110.0)
    watch.message(enforced_cycle(111.0))
    assert err.getvalue().splitlines() == [
        "disconnected: connection refused; retrying in 0.2s",
        "reconnected to 127.0.0.1:50051",
    ]
    assert [list(json.loads(line)) for line in out.getvalue().splitlines()] == [["cycle"]] * 2


def test_a_pipe_prints_nothing_again_while_lost():
    """Not on a terminal nothing is redrawn: a lost stream is its line, and the table is
    not printed again (greyed or not) until a message changes it."""
    out = io.StringIO()
    watch, _ = printer(PrintingScreen(out, width=80))
    watch.message(enforced_cycle(100.0))
    before = out.getvalue()
    for attempt in range(3):
        watch.disconnected(lost(101.0 + attempt, attempt=attempt))
    watch.refresh(120.0)
    assert out.getvalue() == before + "disconnected: connection refused; retrying in 0.2s\n"


def test_a_snapshot_seen_before_the_loss_is_aged_too():
    """The heading of a snapshot (no cycle since) counts on as a cycle's does."""
    screen = RecordingScreen()
    watch, _ = printer(screen)
    snapshot = pb.NodeSnapshot(node_name="n1", agent_instance_id="a" * 8, readiness=ready())
    watch.message(Snapshot(snapshot=snapshot, resync=False, restarted=False, received_at=10.0))
    watch.disconnected(lost(12.0))
    assert screen.shown[1].startswith("snapshot  node n1")
    assert "ready, last good cycle 2.0s ago" in screen.shown[1]


@pytest.mark.parametrize(
    ("code", "error", "reason"),
    [
        ("UNAVAILABLE", REFUSED, "connection refused"),
        (
            "UNAVAILABLE",
            "UNAVAILABLE: failed to connect to all addresses; last error: FAILED_PRECONDITION: "
            "unix:/run/x.sock: connect failed: addr: unix:/run/x.sock error: No such file or "
            "directory",
            "no socket there",
        ),
        (
            "UNAVAILABLE",
            "UNAVAILABLE: errors resolving nosuch.invalid:50051: [field:hostname lookup "
            "error:address lookup failed for nosuch.invalid:50051: Domain name not found]",
            "name not resolved",
        ),
        ("UNAVAILABLE", "UNAVAILABLE: Socket closed", "connection closed"),
        ("UNAVAILABLE", "UNAVAILABLE: recvmsg:Connection reset by peer", "connection reset"),
        ("OK", "stream ended by the agent", "stream ended by the agent"),
        (None, "no message for 4s; presuming the stream dead", "no message for 4s"),
        ("DEADLINE_EXCEEDED", "DEADLINE_EXCEEDED", "timed out"),
        (
            "FAILED_PRECONDITION",
            "FAILED_PRECONDITION: this agent serves node-a; asked for node-b",
            "FAILED_PRECONDITION: this agent serves node-a",
        ),
        ("RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED: " + "x" * 200, None),
    ],
)
def test_the_reason_is_a_few_words_from_grpcs_status_text(
    code: str | None, error: str, reason: str | None
):
    """What grpc says (its core's and the OS's words) becomes a few words; a status with
    no words of ours is its code and the first clause of its details, cut short."""
    event = Disconnected(
        error=error,
        code=None if code is None else grpc.StatusCode[code],
        retry_in=1.0,
        attempt=0,
        received_at=0.0,
    )
    said = disconnect_reason(event)
    if reason is None:
        assert said.startswith("RESOURCE_EXHAUSTED: xxx")
        assert len(said) <= 72
    else:
        assert said == reason
