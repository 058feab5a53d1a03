"""The fake API server's events endpoint: ``POST /api/v1/namespaces/{ns}/events``.

A mixin for the fake's request handler. Like the real API server it requires
the Event's involved object to be in the namespace it is posted to (422
otherwise), names the Event from its ``generateName``, and answers 201 with
the created object. Created Events are kept for tests to read.
"""

from __future__ import annotations

import itertools
import json
from typing import Any
from urllib.parse import urlsplit

from tests.fakes.kube_store import status_body

_names = itertools.count(1)


class EventsEndpoint:
    """Mixed into the handler, which supplies ``fake``, ``rfile``, ``headers`` and
    ``_send_json``."""

    def do_POST(self) -> None:  # http.server's name for it
        handler: Any = self
        url = urlsplit(handler.path)
        parts = url.path.strip("/").split("/")
        if not (
            len(parts) == 5 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "events"
        ):
            handler._send_json(404, status_body(404, f"the server could not find {url.path}"))
            return
        namespace = parts[3]
        raw = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        fault = handler.fake._admit_event(url.path)
        if fault is not None:
            handler._send_json(fault.code, status_body(fault.code, "injected fault"))
            return
        try:
            body = json.loads(raw)
            involved = body["involvedObject"]["namespace"]
        except (ValueError, KeyError, TypeError) as err:
            handler._send_json(400, status_body(400, f"bad event: {err}"))
            return
        if involved != namespace:
            message = f"involvedObject.namespace {involved!r} does not match {namespace!r}"
            handler._send_json(422, status_body(422, message))
            return
        metadata = dict(body.get("metadata") or {})
        metadata["name"] = f"{metadata.get('generateName', 'event.')}{next(_names):05x}"
        metadata["namespace"] = namespace
        created = {**body, "metadata": metadata}
        handler.fake._record_event(created)
        handler._send_json(201, created)
