"""Wire shapes the fake Kubernetes API server shares across resources.

``Status`` failure objects (with the reasons the real API server gives each
code, and ``details`` naming the object where it names one), the
kind/apiVersion stamp watch events and single-object answers carry, BOOKMARK
objects, and the RFC 3339 timestamps object metadata uses.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

Obj = dict[str, Any]

_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def status_body(
    code: int,
    message: str,
    reason: str | None = None,
    *,
    details: dict[str, Any] | None = None,
) -> Obj:
    """A ``meta/v1 Status`` failure object, as the API server returns it."""
    body: Obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or _REASONS.get(code, "Unknown"),
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


def not_found(resource: str, group: str, name: str) -> Obj:
    """404 for ``name`` of ``resource`` (plural, e.g. ``nodes``) as the real server words it."""
    qualified = f"{resource}.{group}" if group else resource
    return status_body(
        404,
        f'{qualified} "{name}" not found',
        details={"name": name, "group": group, "kind": resource},
    )


def already_exists(resource: str, group: str, name: str) -> Obj:
    qualified = f"{resource}.{group}" if group else resource
    return status_body(
        409,
        f'{qualified} "{name}" already exists',
        "AlreadyExists",
        details={"name": name, "group": group, "kind": resource},
    )


def conflict(resource: str, group: str, name: str) -> Obj:
    """409 Conflict: a write conditional on a resourceVersion that is no longer current."""
    qualified = f"{resource}.{group}" if group else resource
    return status_body(
        409,
        f'Operation cannot be fulfilled on {qualified} "{name}": the object has been modified;'
        " please apply your changes to the latest version and try again",
        "Conflict",
        details={"name": name, "group": group, "kind": resource},
    )


def typed(obj: Obj, kind: str, api_version: str) -> Obj:
    """Watch events and single-object answers carry kind/apiVersion; list items do not."""
    return {"kind": kind, "apiVersion": api_version, **obj}


def bookmark_object(rv: int, kind: str = "Pod", api_version: str = "v1") -> Obj:
    return {"kind": kind, "apiVersion": api_version, "metadata": {"resourceVersion": str(rv)}}


def now_rfc3339() -> str:
    """Wall-clock now, as metadata timestamps are written (whole seconds, UTC)."""
    return datetime.fromtimestamp(time.time(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
