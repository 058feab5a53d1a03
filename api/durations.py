"""``google.protobuf.Duration`` fields from the wire, read as seconds and range-checked.

``Duration.ToTimedelta()`` trusts its message: seconds past what a ``timedelta``
holds (the wire allows any int64: ``2**62`` s) raise OverflowError, and nanos
out of range or of the other sign are taken as they are. Whatever reads a
Duration a peer sent -- the servers a request's ``heartbeat_interval``, the
client library an agent's ``interval``, ``stale_after`` and ages -- reads it
through :func:`seconds`: a float within the bounds the field allows, or a
:class:`DurationError` naming the field, which the reader turns into
INVALID_ARGUMENT (a server) or a malformed message (a client).
"""

from __future__ import annotations

from google.protobuf.duration_pb2 import Duration

# The range the Duration type allows (about 10,000 years either way).
MAX_SECONDS = 315_576_000_000
_MAX_NANOS = 999_999_999


class DurationError(ValueError):
    """A Duration that is not one, or outside the range its field allows."""


def seconds(
    duration: Duration, *, field: str, low: float = 0.0, high: float = MAX_SECONDS
) -> float:
    """``duration`` in seconds, within ``[low, high]``. Raises DurationError."""
    whole, nanos = duration.seconds, duration.nanos
    if (
        abs(whole) > MAX_SECONDS
        or abs(nanos) > _MAX_NANOS
        or (whole > 0 and nanos < 0)
        or (whole < 0 and nanos > 0)
    ):
        raise DurationError(f"{field} is not a valid Duration (seconds={whole}, nanos={nanos})")
    value = whole + nanos / 1e9
    if not low <= value <= high:
        raise DurationError(f"{field} must be between {low:g}s and {high:g}s, got {value:g}s")
    return value
