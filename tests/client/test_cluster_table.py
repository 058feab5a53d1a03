"""The nodes table of ``capwatch watch --cluster``, rendered from cluster-stream messages."""

from __future__ import annotations

from datetime import timedelta

import pytest

from capwatch.api.gen.capwatch.v1 import cluster_health_pb2 as cpb
from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.watch.cluster_table import (
    NODE_COLUMNS,
    NodeBoard,
    age_text,
    middle_cut,
    natural_key,
    node_cells,
    node_styles,
    node_table,
)
from capwatch.watch.layout import FAILED, GOOD, fit, plain

HEALTHY, UNHEALTHY = pb.DEVICE_HEALTH_HEALTHY, pb.DEVICE_HEALTH_UNHEALTHY
LONG_MESSAGE = "gpu1 (GPU-5e5e5e5e-0000-4000-8000-000000000001): write_failed: " + "x" * 200


def node(
    name: str,
    status: int = cpb.CONDITION_STATUS_TRUE,
    *,
    reason: str = "CapsEnforced",
    message: str = "power caps enforced; 8 of 8 GPUs capped",
    link: int = cpb.AGENT_LINK_CONNECTED,
    unhealthy: int = 0,
    gpus: int = 8,
    age_s: float | None = 1.5,
) -> cpb.NodeHealth:
    health = [UNHEALTHY] * unhealthy + [HEALTHY] * (gpus - unhealthy)
    message_ = cpb.NodeHealth(
        node_name=name,
        condition=cpb.NodeCondition(status=status, reason=reason, message=message),
        agent_link=link,
        gpus=[cpb.GpuSummary(index=i, health=h) for i, h in enumerate(health)],
    )
    if age_s is not None:
        message_.last_cycle_age.FromTimedelta(timedelta(seconds=age_s))
    return message_


def failing(name: str, *, unhealthy: int = 1) -> cpb.NodeHealth:
    return node(
        name,
        cpb.CONDITION_STATUS_FALSE,
        reason="CapWriteFailed",
        message=LONG_MESSAGE,
        unhealthy=unhealthy,
    )


def snapshot(*nodes: cpb.NodeHealth, sequence: int = 4) -> cpb.ClusterSnapshot:
    return cpb.ClusterSnapshot(
        controller_instance_id="c0ffee00-0000-4000-8000-000000000001",
        shard=cpb.Shard(index=1, count=3, holder="ctl-1-a", leading=True),
        sequence=sequence,
        nodes=list(nodes),
    )


def rows_of(lines: list[str]) -> list[list[str]]:
    return [line.split(maxsplit=6) for line in lines]


def test_a_row_says_condition_link_gpus_age_and_message():
    """Each column from its field: status and reason, the agent link, GPUs healthy of
    total, the age, and the message; unknown values read '-'."""
    assert node_cells(failing("gpu-7"), 3.25) == (
        "gpu-7",
        "False",
        "CapWriteFailed",
        "connected",
        "7/8",
        "3.2s",
        LONG_MESSAGE,
    )
    missing = node(
        "gpu-8",
        cpb.CONDITION_STATUS_UNKNOWN,
        reason="AgentMissing",
        message="",
        link=cpb.AGENT_LINK_MISSING,
        gpus=0,
        age_s=None,
    )
    assert node_cells(missing, None) == (
        "gpu-8",
        "Unknown",
        "AgentMissing",
        "missing",
        "-",
        "-",
        "-",
    )
    assert node_cells(cpb.NodeHealth(node_name="new"), None)[1:4] == ("-", "-", "-")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.04, "0.0s"), (9.94, "9.9s"), (10.0, "10s"), (59.9, "59s"), (61, "1m"), (7200, "2h"),
     (200000, "2d")],
)  # fmt: skip
def test_ages_fit_in_five_characters(seconds: float, text: str):
    """Ages read as a person would say them, never wider than the column."""
    assert age_text(seconds) == text
    assert len(text) <= 5


def test_failures_are_red_unknown_yellow_true_green():
    """False: status, reason and message red (and GPUs when one is unhealthy); Unknown
    yellow; True green with its reason and message plain."""
    assert node_styles(failing("a")) == ("", FAILED, FAILED, "", FAILED, "", FAILED)
    unknown = node("b", cpb.CONDITION_STATUS_UNKNOWN, link=cpb.AGENT_LINK_UNREACHABLE)
    assert node_styles(unknown) == ("", "yellow", "yellow", "yellow", "", "", "yellow")
    assert node_styles(node("c")) == ("", GOOD, "", "", "", "", "")


@pytest.mark.parametrize("width", [60, 72, 73, 79, 80, 92, 93, 120, 160])
def test_the_table_fits_its_width_and_keeps_what_matters(width: int):
    """At any width every line fits; NODE, STATUS, REASON and MESSAGE are always there
    (the message cut with an ellipsis); GPUS joins at 73 columns, AGE at 80 (so both
    on an 80-column terminal), AGENT at 93."""
    nodes = [node("gpu-a"), failing("gpu-b")]
    rows = [(node_cells(n, 1.0), node_styles(n)) for n in nodes]
    lines = [plain(line) for line in node_table(rows, width)]
    assert max(len(line) for line in lines) <= width
    header = lines[0].split()
    assert {"NODE", "STATUS", "REASON", "MESSAGE"} <= set(header)
    assert ("GPUS" in header, "AGE" in header, "AGENT" in header) == (
        width >= 73,
        width >= 80,
        width >= 93,
    )
    assert lines[2].endswith("…")
    if width >= 80:
        assert lines[2].split()[:3] == ["gpu-b", "False", "CapWriteFailed"]


@pytest.mark.parametrize("width", [80, 120, None])
def test_columns_do_not_move_when_a_node_fails(width: int | None):
    """Column positions depend on the width alone: a node that fails (a longer reason, a
    long message, unhealthy GPUs) moves nothing in its row or the header."""
    good = node_table([(node_cells(node("gpu-a"), 1.0), node_styles(node("gpu-a")))], width)
    bad_node = failing("gpu-a")
    bad = node_table([(node_cells(bad_node, 1.0), node_styles(bad_node))], width)
    assert plain(good[0]) == plain(bad[0])
    assert _starts(plain(good[1])) == _starts(plain(bad[1]))


def _starts(line: str) -> list[int]:
    """Where each column starts: two spaces separate columns, one space is inside a cell."""
    return [i for i in range(len(line)) if line[i] != " " and (i == 0 or line[i - 2 : i] == "  ")]


def test_no_width_shows_every_column_and_the_whole_message():
    """A pipe without COLUMNS drops and cuts nothing: logs keep the whole message and the
    whole node name, however long."""
    assert fit(NODE_COLUMNS, None)[-1] == 1024
    name = "gke-prod-gpu-pool-a100-80gb-3f2a9c1b-x7k2"
    lines = node_table(
        [(node_cells(failing(name), 1.0), node_styles(failing(name)))], None, longest=len(name)
    )
    assert plain(lines[1]).startswith(f"  {name}  False")
    assert plain(lines[1]).endswith(LONG_MESSAGE)


def test_a_long_node_name_loses_its_middle_on_a_terminal():
    """Names of one pool share a prefix: a cut keeps both ends, so nodes stay apart."""
    assert middle_cut("gke-prod-gpu-pool-a100-80gb-3f2a9c1b-x7k2", 18) == "gke-prod…9c1b-x7k2"
    assert middle_cut("short", 18) == "short"
    line = plain(node_table([(node_cells(node("x" * 20 + "-tail"), 1.0), ("",) * 7)], 80)[1])
    assert line.split()[0] == "xxxxxxxx…xxxx-tail"


def test_board_snapshot_then_a_line_per_changed_node():
    """The snapshot is printed whole (heading, header, every node by name); an update
    is one line, aligned under the snapshot's header, and a note when the condition moved
    (the history a terminal keeps above the table)."""
    board = NodeBoard()
    first = board.snapshot(snapshot(node("gpu-b"), node("gpu-a")), 100.0, 120)
    text = [plain(line) for line in first.changes]
    assert text[0].startswith("cluster  controller c0ffee00-0000-4000-8000-000000000001")
    assert "shard 1/3 leader" in text[0]
    assert "2 nodes: 2 True" in " ".join(text[:2])
    header = next(line for line in text if line.lstrip().startswith("NODE"))
    rows = text[text.index(header) + 1 :]
    assert [row.split()[0] for row in rows if row] == ["gpu-a", "gpu-b"]
    assert rows[-1] == ""

    changed = board.update(cpb.NodeUpdate(sequence=5, node=failing("gpu-b")), 102.0, 120)
    (line,) = [plain(x) for x in changed.changes]
    assert line.split()[:5] == ["gpu-b", "False", "CapWriteFailed", "connected", "7/8"]
    assert _starts(line) == _starts(rows[1])
    (note,) = [plain(x) for x in changed.notes]
    assert note.startswith("update 5  gpu-b  True → False CapWriteFailed: gpu1 (GPU-")
    block = [plain(x) for x in changed.block]
    assert "update 5" in block[0]
    assert any("1 True, 1 False" in x for x in block[:2])
    # Unchanged gpu-a is aged in place: 1.5 s when sent, 2 s since.
    assert next(x for x in block if x.split()[:1] == ["gpu-a"]).split()[5] == "3.5s"

    again = board.update(cpb.NodeUpdate(sequence=6, node=failing("gpu-b", unhealthy=2)), 103, 120)
    assert again.notes == ()  # the same condition: a changed line, no history
    assert plain(again.changes[0]).split()[4] == "6/8"
    unseen = failing("gpu-b", unhealthy=2)
    unseen.agent_address = "10.0.0.9:50051"  # not a column: nothing to print
    assert board.update(cpb.NodeUpdate(sequence=7, node=unseen), 104, 120).changes == ()


def test_board_removed_node_and_heartbeats():
    """A node that left prints a line saying so and leaves the table; a heartbeat prints
    nothing unless the shard's leader moved, and then the heading."""
    board = NodeBoard()
    board.snapshot(snapshot(node("gpu-a"), node("gpu-b")), 100.0, 120)
    gone = board.update(
        cpb.NodeUpdate(sequence=5, node=cpb.NodeHealth(node_name="gpu-b"), removed=True), 101.0, 120
    )
    (line,) = [plain(x) for x in gone.changes]
    assert line.split()[:3] == ["gpu-b", "-", "(removed)"]
    assert [plain(x) for x in gone.notes] == ["update 5  gpu-b left this shard's view"]
    assert not any(plain(x).split()[:1] == ["gpu-b"] for x in gone.block)

    beat = cpb.ClusterHeartbeat(last_sequence=5, shard=snapshot().shard)
    quiet = board.heartbeat(beat, 110.0, 120)
    assert quiet.changes == ()
    assert plain(quiet.block[-1]).startswith("heartbeat  --:--:--  update 5")
    standby = cpb.ClusterHeartbeat(
        last_sequence=5, shard=cpb.Shard(index=1, count=3, holder="ctl-1-b", leading=False)
    )
    moved = board.heartbeat(standby, 111.0, 120)
    assert "shard 1/3 standby (leader ctl-1-b)" in " ".join(plain(x) for x in moved.changes)


def test_a_printing_screen_gets_no_block_per_update():
    """Where nothing is redrawn (a pipe) an update builds its line alone, not the whole
    table (thousands of nodes); the snapshot is still printed whole."""
    redrawn, printed = NodeBoard(), NodeBoard(blocks=False)
    first = [
        b.snapshot(snapshot(node("gpu-a"), node("gpu-b")), 100.0, 80) for b in (redrawn, printed)
    ]
    assert first[0] == first[1]
    update = cpb.NodeUpdate(sequence=5, node=failing("gpu-b"))
    full, bare = (b.update(update, 101.0, 80) for b in (redrawn, printed))
    assert (bare.changes, bare.notes) == (full.changes, full.notes)
    assert full.block
    assert bare.block == ()


def test_nodes_are_in_natural_order():
    """A pool's nodes read as numbered: sim-node-2 before sim-node-10, not after it (the
    order the names sort in as text)."""
    names = [f"sim-node-{i}" for i in range(12)]
    board = NodeBoard()
    frame = board.snapshot(snapshot(*(node(name) for name in reversed(names))), 100.0, None)
    rows = [plain(line).split()[0] for line in frame.block[2:]]
    assert rows == names
    assert natural_key("a-9-b") < natural_key("a-10-a") < natural_key("a-10-b")
    assert sorted(["n-01", "n-1", "n-0"], key=natural_key) == ["n-0", "n-01", "n-1"]


@pytest.mark.parametrize("width", [80, 120, None])
def test_node_is_as_wide_as_the_longest_name_and_the_message_gets_the_rest(
    width: int | None,
):
    """NODE is sized to the names seen (``sim-node-11``: 11 characters, not 28), so at 120
    columns a node's usual message is whole where it was cut; a longer name seen later
    widens it, on a terminal up to its usual width (a longer one still loses its
    middle)."""
    names = [f"sim-node-{i}" for i in range(12)]
    board = NodeBoard()
    frame = board.snapshot(snapshot(*(node(name) for name in names)), 100.0, width)
    lines = [plain(line) for line in frame.block]
    header = next(line for line in lines if line.startswith("  NODE"))
    assert header.index("STATUS") == len("  sim-node-11  ")
    rows = lines[lines.index(header) + 1 :]
    if width != 80:
        assert all(row.endswith("power caps enforced; 8 of 8 GPUs capped") for row in rows)
    long_name = "gke-prod-gpu-pool-a100-80gb-3f2a9c1b-x7k2"
    later = board.update(cpb.NodeUpdate(sequence=5, node=node(long_name)), 101.0, width)
    header = next(x for x in map(plain, later.block) if x.startswith("  NODE"))
    usual = {80: 18, 120: 28, None: len(long_name)}[width]  # as before this name came
    assert header.index("STATUS") == 2 + usual + 2


def test_the_picture_later_counts_ages_on():
    """``block_at``: the table as last received, each node's age counted on from when its
    message arrived (what a watch that lost its stream shows)."""
    board = NodeBoard()
    board.snapshot(snapshot(node("gpu-a", age_s=1.5)), 100.0, 120)
    board.update(cpb.NodeUpdate(sequence=5, node=node("gpu-b", age_s=0.5)), 110.0, 120)
    rows = {plain(x).split()[0]: plain(x).split() for x in board.block_at(125.0, None)[2:]}
    assert (rows["gpu-a"][5], rows["gpu-b"][5]) == ("26s", "15s")
