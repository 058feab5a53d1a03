"""The API server's wire format, without the client library: what a request can fail
with (:data:`TRANSIENT`), an HTTP error answer as :class:`ApiStatusError` (so code above
the client never sees its exception types), Retry-After, JSON bodies and
newline-delimited watch streams. The agent and the controller read it alike.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
from collections.abc import Iterator, Mapping
from typing import Any

import urllib3
import urllib3.exceptions

from capwatch.kit.errors import CapwatchError

logger = logging.getLogger(__name__)

# Every write to the API server is bounded by this, connect and read alike: the agent's
# Events and its sim driver's slice, the controller's conditions, Events and taints (there
# with the lease's renew deadline when that comes first: the fence, docs/controller.md).
WRITE_TIMEOUT_S = 10.0

# Server-side apply's content type; JSON is YAML, so the body is sent as JSON.
APPLY = "application/apply-patch+yaml"

# What a request can fail with, short of a bug and of an HTTP answer: transport
# errors (urllib3, sockets, http.client framing), undecodable bodies (ValueError
# covers json.JSONDecodeError).
TRANSIENT = (
    urllib3.exceptions.HTTPError,
    OSError,
    http.client.HTTPException,
    ValueError,
)


class ApiStatusError(CapwatchError):
    """The API server answered a request with an HTTP error status."""

    def __init__(self, *, status: int, reason: str, retry_after: float | None = None) -> None:
        super().__init__(f"HTTP {status} {reason}")
        self.status = status
        self.reason = reason
        self.retry_after = retry_after  # seconds, from a Retry-After header


def retry_after_seconds(headers: Mapping[str, str] | None) -> float | None:
    """The Retry-After header in seconds, or None when absent or not a finite number
    (the HTTP-date form is not used by Kubernetes). Every Kubernetes client of
    capwatch's, the agent's and the controller's, reads it here."""
    value = (headers or {}).get("Retry-After")
    try:
        seconds = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return max(0.0, seconds) if math.isfinite(seconds) else None


def read_json(response: urllib3.HTTPResponse) -> dict[str, Any]:
    """A whole (non-streamed) response's JSON object; the connection goes back to the pool."""
    try:
        data = response.data
    finally:
        response.release_conn()
    decoded = json.loads(data)
    if not isinstance(decoded, dict):
        raise ValueError(f"expected a JSON object, got {type(decoded).__name__}")
    return decoded


def stream_lines(response: urllib3.HTTPResponse) -> Iterator[str]:
    """Newline-delimited records of a streamed response, as they arrive."""
    buffer = b""
    for chunk in response.stream(amt=None, decode_content=False):
        buffer += bytes(chunk)
        *complete, buffer = buffer.split(b"\n")
        for line in complete:
            if line.strip():
                yield line.decode("utf-8", errors="replace")


def shutdown_response(response: urllib3.HTTPResponse) -> None:
    """Unblock a thread reading ``response``: shut the socket's read side."""
    try:
        response.shutdown()
    except (OSError, ValueError, RuntimeError, AttributeError):
        logger.debug("watch response already closed")


def as_mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def status_message(data: bytes | None) -> str:
    """The message of a ``Status`` error body, or a short prefix of whatever came back."""
    try:
        decoded = json.loads(data or b"")
    except ValueError:
        return (data or b"")[:120].decode("utf-8", errors="replace")
    return str(decoded.get("message", "")) if isinstance(decoded, dict) else ""
