"""Publishes the sim DRA driver's ResourceSlice (agent.dra.simdriver) by server-side apply.

Apply, never create-then-update: the first publish and every later one are the same
request, a slice someone deleted comes back on the next one, and a field another
manager set on the slice is taken back (``force``: the slice is this driver's alone,
as a kubelet plugin's slices are its own). The Node is read once for its UID (the
slice's owner); a node that cannot be read leaves the slice unowned, not unpublished.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from capwatch.kit.errors import CapwatchError
from capwatch.kube.client import describe, raw_get
from capwatch.kube.transport import ApiTransport
from capwatch.kube.wire import (
    APPLY,
    TRANSIENT,
    WRITE_TIMEOUT_S,
    ApiStatusError,
    read_json,
    status_message,
)

log = logging.getLogger(__name__)

FIELD_MANAGER = "capwatch-sim-driver"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


class SlicePublishError(CapwatchError):
    """The slice could not be applied (one line: the request and why)."""


class SlicePublisher:
    """Applies one ResourceSlice through ``transport``; blocking (run it in a thread)."""

    def __init__(self, transport: ApiTransport, *, timeout: float = WRITE_TIMEOUT_S) -> None:
        self._transport = transport
        self._timeout = timeout

    def node_uid(self, node: str) -> str | None:
        """The Node's UID, or None (logged) when it cannot be read."""
        path = f"/api/v1/nodes/{node}"
        try:
            found = read_json(raw_get(self._transport, path, timeout=(self._timeout,) * 2))
        except (*TRANSIENT, ApiStatusError) as err:
            log.warning("cannot read node %s for the sim driver's slice owner: %s", node, err)
            return None
        uid = found.get("metadata", {}).get("uid")
        return uid if isinstance(uid, str) and uid else None

    def apply(self, body: Mapping[str, Any]) -> None:
        """Create or update the slice to ``body``."""
        name = body["metadata"]["name"]
        what = f"apply resourceslices/{name}"
        try:
            response = self._transport.request(
                "PATCH",
                f"{SLICES}/{name}",
                query={"fieldManager": FIELD_MANAGER, "force": "true"},
                body=json.dumps(body).encode(),
                content_type=APPLY,
                timeout=(self._timeout, self._timeout),
            )
            status, data = response.status, response.data
            response.release_conn()
        except TRANSIENT as err:
            raise SlicePublishError(f"{what}: {describe(err)}") from err
        if not 200 <= status < 300:
            raise SlicePublishError(f"{what}: HTTP {status} {status_message(data)}")
