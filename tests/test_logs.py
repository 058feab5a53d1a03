"""ThrottledLog (server/logs.py): a burst of lines, then one per refill period, the rest counted."""

from __future__ import annotations

import logging

import pytest

from agent.clock import FakeClock
from server.logs import ThrottledLog


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "test.throttled"]


def test_a_burst_passes_then_lines_are_counted_and_reported_with_the_next(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Burst 3, one line per 10 s: 100 lines at once log 3; 10 s later the next one says
    97 were suppressed; the count starts again from there."""
    clock = FakeClock()
    throttled = ThrottledLog(
        logging.getLogger("test.throttled"), burst=3, refill_s=10.0, clock=clock.monotonic
    )
    caplog.set_level(logging.WARNING, logger="test.throttled")
    for i in range(100):
        throttled.warning("bad request n=%d", i)
    assert lines(caplog) == ["bad request n=0", "bad request n=1", "bad request n=2"]
    assert throttled.suppressed == 97
    clock.advance(9.0)
    throttled.warning("bad request n=%d", 100)
    assert len(lines(caplog)) == 3  # not a whole token yet
    clock.advance(1.0)
    throttled.warning("bad request n=%d", 101)
    assert lines(caplog)[-1] == "bad request n=101 (98 similar lines suppressed)"
    assert throttled.suppressed == 0
    assert all(r.exc_info is None and r.levelno == logging.WARNING for r in caplog.records)


def test_a_quiet_period_refills_the_burst_but_no_more(caplog: pytest.LogCaptureFixture) -> None:
    """After an hour of silence the bucket holds the burst again, not an hour's worth."""
    clock = FakeClock()
    throttled = ThrottledLog(
        logging.getLogger("test.throttled"), burst=2, refill_s=1.0, clock=clock.monotonic
    )
    caplog.set_level(logging.WARNING, logger="test.throttled")
    clock.advance(3600)
    for _ in range(10):
        throttled.warning("refused")
    assert lines(caplog) == ["refused", "refused"]
