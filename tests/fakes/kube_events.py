"""The fake API server's events endpoint: ``POST /api/v1/namespaces/{ns}/events``.

A mixin for the fake's request handler, and the store of created Events.
Checked as the real API server checks a ``core/v1`` Event:

- the involved object's namespace must be the Event's (422 otherwise); an
  involved object without a namespace (a Node, any cluster-scoped object)
  takes its Events in ``default`` only;
- a ``metadata.namespace`` in the body must be the URL's (400);
- ``metadata.name`` is used as given, else ``generateName`` plus a unique
  suffix; neither is 422; a name that exists in the namespace is 409
  ``AlreadyExists``.

Answers 201 with the created object (given uid, resourceVersion and
creationTimestamp). Created Events are kept in order with the server time and
the User-Agent that posted them. Not modelled: reading Events back over HTTP,
updates (a recorder's count++ PATCH), ``events.k8s.io/v1``.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from tests.fakes.kube_store import Obj, ObjectStore, ResourceVersions
from tests.fakes.kube_wire import already_exists, now_rfc3339, status_body

_names = itertools.count(1)


@dataclass(frozen=True, kw_only=True)
class EventWrite:
    """One created Event."""

    at: float  # server time.monotonic()
    namespace: str
    name: str
    user_agent: str
    event: Obj  # as created


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
        involved = body.get("involvedObject") if isinstance(body, dict) else None
        metadata = (body.get("metadata") or {}) if isinstance(body, dict) else None
        if not isinstance(involved, dict) or not isinstance(metadata, dict):
            return 400, status_body(400, "bad event: involvedObject and metadata must be objects")
        if metadata.get("namespace") not in (None, "", namespace):
            message = (
                "the namespace of the provided object does not match the namespace sent on"
                " the request"
            )
            return 400, status_body(400, message)
        involved_ns = involved.get("namespace") or ""
        if involved_ns != namespace and (involved_ns or namespace != "default"):
            message = (
                f"involvedObject.namespace: Invalid value: {involved_ns!r}: does not match"
                f" event.namespace {namespace!r}"
            )
            return 422, status_body(422, message)
        name = metadata.get("name") or ""
        if not name and metadata.get("generateName"):
            name = f"{metadata['generateName']}{next(_names):05x}"
        if not name:
            return 422, status_body(
                422, "metadata.name: Required value: name or generateName is required"
            )
        created: Obj = {
            **body,
            "metadata": {
                **metadata,
                "name": name,
                "namespace": namespace,
                "uid": str(uuid.uuid4()),
                "creationTimestamp": now_rfc3339(),
            },
        }
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
        return 201, created


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
