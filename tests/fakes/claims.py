"""A settable, in-memory claims view for loop tests (implements agent.dra.claims.ClaimView).

It reads the claims the cycle's pods name from those it is given and joins them
with the slices by the agent's own :func:`capwatch.agent.dra.claims.claims_snapshot`, so the
tests drive the same join the real view hands out.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from capwatch.agent.dra.claims import (
    ClaimsSnapshot,
    Pin,
    ReadClaim,
    claims_snapshot,
    referenced_claims,
)
from capwatch.agent.dra.slices import node_devices
from capwatch.agent.pods import PodSnapshot
from capwatch.kit.errors import PodViewError


class StaticClaimView:
    """The ResourceClaims and ResourceSlices the test set; can be made unsynced."""

    def __init__(self, node: str, *, uuid_attribute: str = "uuid") -> None:
        self._node = node
        self._attribute = uuid_attribute
        self._lock = threading.Lock()
        self._claims: list[Mapping[str, Any]] = []
        self._slices: list[Mapping[str, Any]] = []
        self._unsynced: str | None = None
        self._pins: dict[Pin, str] = {}
        self.reads = 0  # claims read, as the real view GETs them

    def set(
        self,
        *,
        claims: Iterable[Mapping[str, Any]] | None = None,
        slices: Iterable[Mapping[str, Any]] | None = None,
    ) -> None:
        with self._lock:
            if claims is not None:
                self._claims = list(claims)
            if slices is not None:
                self._slices = list(slices)

    def set_unsynced(self, reason: str | None) -> None:
        with self._lock:
            self._unsynced = reason

    def snapshot(self, pods: PodSnapshot) -> ClaimsSnapshot:
        """The claims the pods name, read from those set (a claim not set: not found)."""
        with self._lock:
            if self._unsynced is not None:
                raise PodViewError(self._unsynced)
            served = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in self._claims}
            using = referenced_claims(pods)
            self.reads += len(using)
            reads = [
                ReadClaim(
                    key=key, obj=served.get(key), problem="" if key in served else "not found"
                )
                for key in sorted(using)
            ]
            devices = node_devices(self._slices, node=self._node, uuid_attribute=self._attribute)
            snapshot = claims_snapshot(reads, using, devices, pins=self._pins)
            self._pins = dict(snapshot.pins)
            return snapshot

    def close(self) -> None:
        return
