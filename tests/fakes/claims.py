"""A settable, in-memory claims view for loop tests (implements agent.claims.ClaimView).

It joins the claims and slices it is given with the agent's own
:func:`agent.claims.claims_snapshot`, so the tests drive the same join the real
informer-backed view hands out.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from agent.claims import ClaimsSnapshot, claims_snapshot
from kit.errors import PodViewError


class StaticClaimView:
    """The ResourceClaims and ResourceSlices the test set; can be made unsynced."""

    def __init__(self, node: str, *, uuid_attribute: str = "uuid") -> None:
        self._node = node
        self._attribute = uuid_attribute
        self._lock = threading.Lock()
        self._claims: list[Mapping[str, Any]] = []
        self._slices: list[Mapping[str, Any]] = []
        self._unsynced: str | None = None

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

    def snapshot(self) -> ClaimsSnapshot:
        with self._lock:
            if self._unsynced is not None:
                raise PodViewError(self._unsynced)
            return claims_snapshot(
                self._claims, self._slices, node=self._node, uuid_attribute=self._attribute
            )

    def close(self) -> None:
        return
