"""Log lines: fields named in the message become JSON keys; text reads as written; a
throttled log lets a burst through, then counts what it holds back."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest

from capwatch.kit.clock import FakeClock
from capwatch.kit.flags import LogFormat
from capwatch.kit.throttling import ThrottledLog
from capwatch.logs import JsonFormatter, configure_logging


def record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("capwatch.test", logging.INFO, __file__, 1, msg, args, None)


@pytest.mark.parametrize(
    ("msg", "args", "message", "fields"),
    [
        (
            "serving /readyz address=%s port=%d target=%s",
            ("127.0.0.1", 8081, "unix:///run/x.sock"),
            "serving /readyz",
            {"address": "127.0.0.1", "port": 8081, "target": "unix:///run/x.sock"},
        ),
        (
            "stream lost target=%s code=%s error=%r attempt=%d retry_in=%.3f",
            ("h:1", "UNAVAILABLE", "connection refused", 2, 0.25),
            "stream lost",
            {
                "target": "h:1",
                "code": "UNAVAILABLE",
                "error": "connection refused",
                "attempt": 2,
                "retry_in": 0.25,
            },
        ),
        (
            "agent assembled node=%s gpus=%d interval=%gs",
            ("n1", 6, 2.0),
            "agent assembled",
            {"node": "n1", "gpus": 6, "interval": "2s"},
        ),
        (
            "cycle failure kind=%s %s",
            ("internal_error", "boom"),
            "cycle failure boom",
            {"kind": "internal_error"},
        ),
        ("loaded path=%s", (Path("/var/lib/x"),), "loaded", {"path": "/var/lib/x"}),
        ("100%% done task=%s", ("t",), "100% done", {"task": "t"}),
    ],
)
def test_json_log_fields_are_keys_not_text(
    msg: str, args: tuple[object, ...], message: str, fields: dict[str, object]
):
    """Each ``key=%x`` of a log call is a JSON key holding the argument's own value
    (numbers stay numbers; a unit after the conversion stays with it); the rest is the
    message."""
    doc = json.loads(JsonFormatter().format(record(msg, *args)))
    assert doc.pop("message") == message
    assert {k: doc[k] for k in fields} == fields
    assert set(doc) == {"time", "level", "logger", *fields}


@pytest.mark.parametrize(
    ("msg", "args"),
    [
        ("in-flight cycle did not finish within %.1fs; restoring anyway", (2.0,)),
        ("nvml initialised", ()),
        ("%(name)s keyed", ()),
        ("message=%s time=%s", ("clash", "now")),
    ],
)
def test_messages_without_fields_stay_as_logging_formats_them(msg: str, args: tuple[object, ...]):
    """Prose, mapping-style formats and keys that would overwrite the record's own keys
    are left in the message exactly as logging formats it."""
    rec = record(msg, *args)
    doc = json.loads(JsonFormatter().format(rec))
    assert doc["message"] == rec.getMessage()
    assert set(doc) == {"time", "level", "logger", "message"}


def test_text_logs_read_as_written():
    """The text format is unchanged: fields stay inline in the message."""
    stream = io.StringIO()
    configure_logging("INFO", LogFormat.TEXT, stream=stream)  # undone by tests/conftest.py
    logging.getLogger("capwatch.test").info("serving port=%d", 8081)
    assert stream.getvalue().rstrip().endswith("INFO    capwatch.test: serving port=8081")


def throttled_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
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
    assert throttled_lines(caplog) == ["bad request n=0", "bad request n=1", "bad request n=2"]
    assert throttled.suppressed == 97
    clock.advance(9.0)
    throttled.warning("bad request n=%d", 100)
    assert len(throttled_lines(caplog)) == 3  # not a whole token yet
    clock.advance(1.0)
    throttled.warning("bad request n=%d", 101)
    assert throttled_lines(caplog)[-1] == "bad request n=101 (98 similar lines suppressed)"
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
    assert throttled_lines(caplog) == ["refused", "refused"]
