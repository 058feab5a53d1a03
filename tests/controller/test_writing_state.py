"""What the condition writer keeps per node (controller/writes/writer.py): a Node seen at
an older resourceVersion than one it wrote is not taken for the truth; nothing is kept
for a node that is removed, gone from the API, or that a standby could not write; and a
condition another field manager owns is taken over only from capwatch's own past.

Time is the virtual loop's."""

from __future__ import annotations

import asyncio

import pytest

from capwatch.controller.errors import ApiError
from capwatch.controller.objects import FieldOwner
from capwatch.controller.writes.writer import CONFLICT_REASON, RETRY_MAX_S
from tests.controller.writing_rig import NODE, TRUE, UNREACHABLE, WRITE_FAILED, Rig, key, settle


def kept(rig: Rig, node: str = NODE) -> dict[str, bool]:
    """Where the writer (and its Event recorder) still hold something for ``node``."""
    writer = rig.writer
    return {
        name: node in table
        for name, table in {
            "desired": writer._desired,
            "written": writer._written,
            "versions": writer._versions,
            "retrying": writer._retrying,
            "events": writer._events._last,
        }.items()
        if node in table
    }


@pytest.mark.asyncio
async def test_a_node_seen_at_an_older_version_than_written_is_not_rewritten() -> None:
    """The writer writes False (the Node's resourceVersion is then 101); the watch then
    delivers the Node as it was at 100, still True: nothing is rewritten and the False
    stands. A Node at a newer version (someone set True after the write) is the truth,
    and the False is written back, keeping its transition time."""
    rig = Rig()
    rig.writer.observed(NODE, rig.carried(TRUE), version=100)
    rig.change(WRITE_FAILED)
    await settle()
    written = rig.api.written(NODE)[-1]
    assert rig.keys() == [key(WRITE_FAILED)]
    assert rig.writer._versions[NODE] == 101

    rig.writer.observed(NODE, rig.carried(TRUE), version=100)
    await settle()
    assert rig.keys() == [key(WRITE_FAILED)]
    assert rig.writer.written(NODE) == written

    await asyncio.sleep(5)
    rig.api.version = 150
    rig.writer.observed(NODE, rig.carried(TRUE), version=120)
    await settle()
    assert rig.keys() == [key(WRITE_FAILED), key(WRITE_FAILED)]
    again = rig.api.written(NODE)[-1]
    assert again.last_transition_wall > written.last_transition_wall  # True -> False again
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_a_removed_node_leaves_nothing_behind() -> None:
    """A node written, its Event posted, its next write failing: once it is removed the
    writer and its recorder keep nothing for it, so a node of the same name that comes
    back is a new node (its first failure gets its Event, not a dedupe)."""
    rig = Rig()
    rig.writer.observed(NODE, rig.carried(TRUE), version=100)
    rig.change(WRITE_FAILED)
    await settle()
    rig.api.failures[NODE] = [ApiError("boom", status=500)]
    rig.change(UNREACHABLE)
    await settle()
    assert set(kept(rig)) == {"desired", "written", "versions", "retrying", "events"}
    rig.writer.node_removed(NODE)
    assert kept(rig) == {}
    assert not rig.writer._queue.waiting(NODE)

    rig.writer.observed(NODE, rig.carried(TRUE), version=200)
    rig.change(WRITE_FAILED)
    await settle()
    assert [r for _, _, r in rig.events.said()].count("CapWriteFailed") == 2
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_a_node_the_api_no_longer_has_leaves_nothing_behind() -> None:
    """A write answered 404: everything kept for the node goes, the recorder's too."""
    rig = Rig()
    rig.writer.observed(NODE, rig.carried(TRUE), version=100)
    rig.change(WRITE_FAILED)
    await settle()
    rig.api.missing.add(NODE)
    rig.change(UNREACHABLE)
    await settle()
    assert kept(rig) == {}
    await asyncio.sleep(RETRY_MAX_S * 2)
    assert len(rig.api.attempts) == 2
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_a_standby_keeps_nothing_for_what_it_could_not_write_and_catches_up() -> None:
    """A standby (fence closed) sees 100 nodes change and 50 of them removed: it keeps
    only the 50 it still tracks, no list of held nodes. When it leads it writes those
    50 at once, and a node whose heartbeat came due meanwhile gets its heartbeat at once
    too (not a heartbeat period later)."""
    rig = Rig(heartbeat_s=300.0)
    rig.fence.budget = 0
    for i in range(100):
        rig.change(WRITE_FAILED, node=f"gpu-{i}")
    rig.writer.observed("beating", rig.carried(TRUE, heartbeat_age=400))
    rig.change(TRUE, node="beating")
    await settle()
    for i in range(50, 100):
        rig.writer.node_removed(f"gpu-{i}")
    assert rig.api.attempts == []
    assert len(rig.writer._desired) == 51
    assert not hasattr(rig.writer, "_held")

    rig.fence.budget = 10.0
    rig.writer.resume()
    for _ in range(20):
        await settle()
    assert {p.node for p in rig.api.patches} == {f"gpu-{i}" for i in range(50)} | {"beating"}
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_a_condition_from_capwatchs_own_past_is_taken_over() -> None:
    """The Node's condition is owned by writes from before any apply: the apply is
    refused, the writer reads the owners, sees only capwatch's past and forces it; no
    conflict is counted and no Event says so."""
    rig = Rig()
    rig.api.owners[NODE] = (FieldOwner(manager="before-first-apply", operation="Update"),)
    rig.change(WRITE_FAILED)
    await settle()
    assert rig.keys() == [key(WRITE_FAILED)]
    assert rig.api.forced == [False, True]
    assert rig.observer.count("conflict") == 0
    assert CONFLICT_REASON not in {r for _, _, r in rig.events.said()}
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_a_condition_someone_else_owns_is_not_forced() -> None:
    """Another release's controller owns the condition: the apply is never forced; the
    write counts as a conflict, a Warning Event names the owner (once, however many
    retries), and the node is retried at its backoff, so it is written once the other
    manager lets go."""
    rig = Rig()
    other = FieldOwner(manager="other-controller", operation="Apply")
    rig.api.owners[NODE] = (other,)
    rig.change(WRITE_FAILED)
    await asyncio.sleep(RETRY_MAX_S * 3)
    assert rig.keys() == []
    assert True not in rig.api.forced
    assert rig.observer.count("conflict") >= 3
    conflicts = [e for e in rig.events.events if e.reason == CONFLICT_REASON]
    assert len(conflicts) == 1
    assert conflicts[0].type.value == "Warning"
    assert "other-controller" in conflicts[0].message

    del rig.api.owners[NODE]
    await asyncio.sleep(RETRY_MAX_S)
    assert rig.keys() == [key(WRITE_FAILED)]
    await rig.writer.stop()
