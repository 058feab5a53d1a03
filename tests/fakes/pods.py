"""A settable, in-memory pod view for loop tests (implements agent.pods.PodView)."""

from __future__ import annotations

import threading
from collections.abc import Iterable

from capwatch.agent.pods import PodInfo, PodSnapshot
from capwatch.kit.errors import PodViewError


class StaticPodView:
    """Returns whatever pods the test set; can be made unsynced or to raise."""

    def __init__(self, pods: Iterable[PodInfo] = ()) -> None:
        self._lock = threading.Lock()
        self._pods = {p.ref.uid: p for p in pods}
        self._unsynced: str | None = None
        self._raise: BaseException | None = None
        self._gate: threading.Event | None = None
        self.snapshots = 0

    def set_pods(self, pods: Iterable[PodInfo]) -> None:
        with self._lock:
            self._pods = {p.ref.uid: p for p in pods}

    def set_unsynced(self, reason: str | None) -> None:
        """Make snapshot() raise PodViewError (None restores it)."""
        with self._lock:
            self._unsynced = reason

    def raise_on_snapshot(self, exc: BaseException | None) -> None:
        """Make snapshot() raise an unexpected exception (a bug, not a sync failure)."""
        with self._lock:
            self._raise = exc

    def hold(self, gate: threading.Event | None) -> None:
        """Make snapshot() block until ``gate`` is set: an API call that never returns."""
        with self._lock:
            self._gate = gate

    def snapshot(self) -> PodSnapshot:
        with self._lock:
            gate = self._gate
        if gate is not None:
            gate.wait()
        with self._lock:
            self.snapshots += 1
            if self._raise is not None:
                raise self._raise
            if self._unsynced is not None:
                raise PodViewError(self._unsynced)
            return PodSnapshot(pods=dict(self._pods))

    def close(self) -> None:
        pass
