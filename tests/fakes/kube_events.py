"""The fake API server's core/v1 Events: ``POST /api/v1/namespaces/{ns}/events``, and
reading them back (``GET /api/v1/events``, ``/api/v1/namespaces/{ns}/events``: list and
watch, by field selector, as ``kubectl describe`` reads a Node's).

A mixin for the fake's request handler, and the store of created Events.
Checked as the real API server (1.37) checks a ``core/v1`` Event without an
``eventTime`` (its legacy validation):

- the involved object's namespace must be the Event's (422 otherwise); an
  involved object without a namespace (a Node, any cluster-scoped object)
  takes its Events in ``default`` only;
- a ``metadata.namespace`` in the body must be the URL's (400);
- ``metadata.name`` is used as given, of any length (the legacy validation
  checks only that it is a path segment: no ``/`` or ``%``, not ``.`` or
  ``..``; 422), else ``generateName`` plus five random characters, the base
  cut to 58 characters as the real name generator cuts it; neither is 422;
  a name that exists in the namespace is 409 ``AlreadyExists``;
- JSON types as the schema has them (a string ``count``, an involved object
  that is not a map: 400), ``firstTimestamp``/``lastTimestamp`` as RFC 3339
  (400 otherwise; stored as the real server stores a ``metav1.Time``: whole
  seconds in UTC), ``eventTime`` as MicroTime (400 otherwise).

Answers 201 with the created object as the real server answers it (uid,
resourceVersion, creationTimestamp, and ``eventTime: null``,
``reportingComponent: ""``, ``reportingInstance: ""`` when not sent). Field
selectors: the real server's for Events (``involvedObject.*``, ``reason``,
``reportingComponent``, ``source``, ``type``, ``metadata.name``,
``metadata.namespace``). Created Events are kept in order with the server
time and the User-Agent that posted them. Not modelled: updates (a
recorder's count++ PATCH), the stricter validation of an Event that has an
``eventTime``, ``events.k8s.io/v1``.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any

from tests.fakes.kube_store import Obj, ObjectStore, ResourceVersions
from tests.fakes.kube_wire import (
    already_exists,
    normalize_micro_time,
    normalize_time,
    now_rfc3339,
    status_body,
)

# The real apiserver's name generator (k8s.io/apiserver/pkg/storage/names).
_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_GENERATED_BASE = 63 - 5
_rng = random.Random()
_TYPES: dict[str, type | tuple[type, ...]] = {
    "involvedObject": dict,
    "source": dict,
    "related": dict,
    "series": dict,
    "reason": str,
    "message": str,
    "type": str,
    "action": str,
    "reportingComponent": str,
    "reportingInstance": str,
    "count": int,
}
_DEFAULTS = {"eventTime": None, "reportingComponent": "", "reportingInstance": ""}


def _source(event: Obj) -> str:
    return str(
        (event.get("source") or {}).get("component") or event.get("reportingComponent") or ""
    )


def _involved(field: str) -> Any:
    return lambda event: str((event.get("involvedObject") or {}).get(field) or "")


EVENT_FIELDS = {
    "metadata.name": lambda event: event["metadata"]["name"],
    "metadata.namespace": lambda event: event["metadata"]["namespace"],
    **{
        f"involvedObject.{field}": _involved(field)
        for field in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion")
    },
    "involvedObject.fieldPath": _involved("fieldPath"),
    "reason": lambda event: str(event.get("reason") or ""),
    "reportingComponent": lambda event: str(event.get("reportingComponent") or ""),
    "source": _source,
    "type": lambda event: str(event.get("type") or ""),
}


@dataclass(frozen=True, kw_only=True)
class EventWrite:
    """One created Event."""

    at: float  # server time.monotonic()
    namespace: str
    name: str
    user_agent: str
    event: Obj  # as created


class EventRequestError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class EventStore(ObjectStore):
    def __init__(self, *, versions: ResourceVersions, history_limit: int = 1000) -> None:
        super().__init__(
            kind="Event", api_version="v1", versions=versions, history_limit=history_limit
        )
        self._writes: list[EventWrite] = []

    def writes(self) -> list[EventWrite]:
        with self.cond:
            return list(self._writes)

    def create_event(self, namespace: str, body: Any, *, user_agent: str) -> tuple[int, Obj]:
        """(HTTP status, answer body) for a POST of ``body`` into ``namespace``."""
        try:
            event, name = _checked(namespace, body)
        except EventRequestError as err:
            return err.code, status_body(err.code, str(err))
        metadata = event.get("metadata") or {}
        created: Obj = {
            **_DEFAULTS,
            **event,
            "metadata": {
                **metadata,
                "name": name,
                "namespace": namespace,
                "uid": str(uuid.uuid4()),
                "creationTimestamp": now_rfc3339(),
            },
        }
        created.pop("apiVersion", None)
        created.pop("kind", None)
        with self.cond:
            try:
                created = self.create((namespace, name), created)
            except ValueError:
                return 409, already_exists("events", "", name)
            self._writes.append(
                EventWrite(
                    at=time.monotonic(),
                    namespace=namespace,
                    name=name,
                    user_agent=user_agent,
                    event=created,
                )
            )
        return 201, {"kind": "Event", "apiVersion": "v1", **created}


def _checked(namespace: str, body: Any) -> tuple[Obj, str]:
    """(the Event as it will be stored, its name), or EventRequestError."""
    if not isinstance(body, dict):
        raise EventRequestError(400, 'Event in version "v1" cannot be handled as a Event')
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise EventRequestError(400, "bad event: metadata must be an object")
    for field, wanted in _TYPES.items():
        value = body.get(field)
        if value is not None and (not isinstance(value, wanted) or isinstance(value, bool)):
            raise EventRequestError(
                400,
                f'Event in version "v1" cannot be handled as a Event: json: cannot unmarshal'
                f" {type(value).__name__} into Go struct field Event.{field}",
            )
    event = _with_times(body)
    if metadata.get("namespace") not in (None, "", namespace):
        raise EventRequestError(
            400,
            "the namespace of the provided object does not match the namespace sent on the request",
        )
    involved_ns = (event.get("involvedObject") or {}).get("namespace") or ""
    if involved_ns != namespace and (involved_ns or namespace != "default"):
        raise EventRequestError(
            422,
            f"involvedObject.namespace: Invalid value: {involved_ns!r}: does not match"
            " event.namespace",
        )
    return event, _name(metadata)


def _with_times(body: Obj) -> Obj:
    """``body`` with its times as the real server stores them (400 for a bad one)."""
    event = dict(body)
    try:
        for field in ("firstTimestamp", "lastTimestamp"):
            if event.get(field) is not None:
                event[field] = normalize_time(event[field])
        if event.get("eventTime") is not None:
            event["eventTime"] = normalize_micro_time(event["eventTime"])
    except ValueError as err:
        raise EventRequestError(
            400, f'Event in version "v1" cannot be handled as a Event: {err}'
        ) from None
    return event


def _name(metadata: dict[str, Any]) -> str:
    name = str(metadata.get("name") or "")
    if not name and metadata.get("generateName"):
        base = str(metadata["generateName"])[:_GENERATED_BASE]
        name = base + "".join(_rng.choice(_ALPHABET) for _ in range(5))
    if not name:
        raise EventRequestError(
            422, "metadata.name: Required value: name or generateName is required"
        )
    if name in (".", "..") or "/" in name or "%" in name:
        raise EventRequestError(
            422, f"metadata.name: Invalid value: {name!r}: may not be '.', '..', or contain '/'"
        )
    return name


class EventsEndpoint:
    """Mixed into the handler, which supplies ``fake``, ``headers`` and ``_send_json``."""

    def _post_event(self, namespace: str, raw: bytes) -> None:
        handler: Any = self
        try:
            body = json.loads(raw)
        except ValueError as err:
            handler._send_json(400, status_body(400, f"bad event: {err}"))
            return
        code, answer = handler.fake.events_store.create_event(
            namespace, body, user_agent=handler.headers.get("User-Agent", "")
        )
        handler._send_json(code, answer)
