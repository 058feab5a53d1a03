"""The API server's wire format as capwatch reads it without the client library
(kube/wire.py): the one Retry-After rule, for the agent and the controller."""

from __future__ import annotations

import pytest

from capwatch.kube.wire import retry_after_seconds


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("3", 3.0),
        ("0.5", 0.5),
        ("0", 0.0),
        ("-4", 0.0),  # a negative wait is no wait
        ("soon", None),
        ("Wed, 21 Oct 2026 07:28:00 GMT", None),  # the date form: Kubernetes sends seconds
        ("nan", None),
        ("inf", None),  # would silence a client for ever
        ("1e400", None),
    ],
)
def test_retry_after_is_finite_seconds_or_nothing(header: str, seconds: float | None):
    """Retry-After as a number of seconds, never negative; anything else is ignored."""
    assert retry_after_seconds({"Retry-After": header}) == seconds


def test_no_header_is_no_retry_after():
    """Absent headers (or none at all) mean the backoff alone decides."""
    assert retry_after_seconds({}) is None
    assert retry_after_seconds(None) is None
