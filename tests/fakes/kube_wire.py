"""Wire shapes the fake Kubernetes API server shares across resources.

``Status`` failure objects (with the reasons the real API server gives each
code, and ``details`` naming the object where it names one), the
kind/apiVersion stamp watch events and single-object answers carry, BOOKMARK
objects, and the RFC 3339 timestamps object metadata uses.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta, timezone
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
    """A ``meta/v1 Status`` failure object, as the API server returns it (``reason=""``:
    none, as the real server sends some of its 500s)."""
    body: Obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": _REASONS.get(code, "Unknown") if reason is None else reason,
        "code": code,
    }
    if not body["reason"]:
        del body["reason"]
    if details is not None:
        body["details"] = details
    return body


def _details(resource: str, group: str, name: str) -> Obj:
    """A Status's details as the real server writes them (an empty group is left out)."""
    details: Obj = {"name": name, "kind": resource}
    if group:
        details["group"] = group
    return details


def not_found(resource: str, group: str, name: str) -> Obj:
    """404 for ``name`` of ``resource`` (plural, e.g. ``nodes``) as the real server words it."""
    qualified = f"{resource}.{group}" if group else resource
    return status_body(
        404,
        f'{qualified} "{name}" not found',
        details=_details(resource, group, name),
    )


def already_exists(resource: str, group: str, name: str) -> Obj:
    qualified = f"{resource}.{group}" if group else resource
    return status_body(
        409,
        f'{qualified} "{name}" already exists',
        "AlreadyExists",
        details=_details(resource, group, name),
    )


def conflict(resource: str, group: str, name: str) -> Obj:
    """409 Conflict: a write conditional on a resourceVersion that is no longer current."""
    qualified = f"{resource}.{group}" if group else resource
    return status_body(
        409,
        f'Operation cannot be fulfilled on {qualified} "{name}": the object has been modified;'
        " please apply your changes to the latest version and try again",
        "Conflict",
        details=_details(resource, group, name),
    )


def typed(obj: Obj, kind: str, api_version: str) -> Obj:
    """Watch events and single-object answers carry kind/apiVersion; list items do not."""
    return {"kind": kind, "apiVersion": api_version, **obj}


# What the real server's empty object of each kind carries beside its metadata.
_EMPTY = {"Pod": {"spec": {"containers": None}, "status": {}}}


def bookmark_object(rv: int, kind: str = "Pod", api_version: str = "v1") -> Obj:
    """An empty object of ``kind`` with only a resourceVersion, as the real server sends
    in a BOOKMARK."""
    return {
        "kind": kind,
        "apiVersion": api_version,
        "metadata": {"resourceVersion": str(rv)},
        **_EMPTY.get(kind, {}),
    }


def now_rfc3339() -> str:
    """Wall-clock now, as metadata timestamps are written (whole seconds, UTC)."""
    return datetime.fromtimestamp(time.time(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_TIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})([.,]\d+)?(Z|[+-]\d{2}:\d{2})")
_RFC3339 = "2006-01-02T15:04:05Z07:00"
_RFC3339_MICRO = "2006-01-02T15:04:05.000000Z07:00"


def _parse(value: object, *, micro: bool) -> datetime:
    layout = _RFC3339_MICRO if micro else _RFC3339
    match = _TIME.fullmatch(value) if isinstance(value, str) else None
    fraction = match.group(7) if match else None
    if match is None or (micro and (fraction is None or len(fraction) != 7)):
        raise ValueError(f"parsing time {value!r} as {layout!r}: cannot parse")
    zone = match.group(8)
    offset = timedelta(0)
    if zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        offset = sign * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6]))
    digits = (fraction or ".0")[1:]
    try:
        stamp = datetime(*(int(match.group(i)) for i in range(1, 7)), tzinfo=timezone(offset))
    except ValueError as err:
        raise ValueError(f"parsing time {value!r} as {layout!r}: {err}") from None
    return stamp.astimezone(UTC) + timedelta(microseconds=int(digits[:6].ljust(6, "0")))


def normalize_time(value: object) -> str:
    """A ``metav1.Time`` as the real server stores it: RFC 3339 in, any fraction and
    offset accepted; whole seconds in UTC out. ValueError for anything else."""
    return _parse(value, micro=False).strftime("%Y-%m-%dT%H:%M:%SZ")


def normalize_micro_time(value: object) -> str:
    """A ``metav1.MicroTime``: exactly six fractional digits in, UTC out."""
    return _parse(value, micro=True).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
