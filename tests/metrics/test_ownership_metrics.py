"""The ownership record's save health as metrics: failed saves counted, unsaved cycles shown."""

from __future__ import annotations

import pytest

from capwatch.agent.reports import CycleFailure, CycleFailureKind, CycleReport
from tests.metrics.conftest import Followed
from tests.metrics.support import value
from tests.server.harness import UUIDS, ok

pytestmark = pytest.mark.asyncio


def _publish(followed: Followed, *, unsaved: int, failures: int) -> None:
    h = followed.harness
    h.sequence += 1
    now_wall, now_mono = h.clock.wall(), h.clock.monotonic()
    h.hub.publish(
        CycleReport(
            sequence=h.sequence,
            started_wall=now_wall,
            finished_wall=now_wall,
            started_monotonic=now_mono,
            finished_monotonic=now_mono,
            gpus=tuple(ok(i) for i in range(len(UUIDS))),
            failures=(CycleFailure(kind=CycleFailureKind.STATE_UNWRITABLE, message="x"),)
            if unsaved >= 3
            else (),
            unsaved_cycles=unsaved,
            save_failures=failures,
        )
    )


async def test_failed_saves_are_counted_and_unsaved_cycles_shown_until_a_save_works(
    followed: Followed,
):
    """capwatch_ownership_save_failures_total adds every failed save attempt; the unsaved-cycles
    gauge follows the latest cycle (0 again once a save succeeded); a state_unwritable cycle
    counts as failed."""
    found = await followed.settle()
    assert value(found, "capwatch_ownership_save_failures_total") == 0.0
    assert value(found, "capwatch_ownership_unsaved_cycles") == 0.0
    for unsaved, failures in ((1, 2), (2, 1), (3, 1)):
        _publish(followed, unsaved=unsaved, failures=failures)
    found = await followed.settle()
    assert value(found, "capwatch_ownership_save_failures_total") == 4.0
    assert value(found, "capwatch_ownership_unsaved_cycles") == 3.0
    assert value(found, "capwatch_cycles_total", result="failed") == 1.0
    _publish(followed, unsaved=0, failures=0)
    found = await followed.settle()
    assert value(found, "capwatch_ownership_unsaved_cycles") == 0.0
    assert value(found, "capwatch_ownership_save_failures_total") == 4.0
