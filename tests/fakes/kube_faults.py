"""What the fake Kubernetes API server was asked, and the failures a test injects.

Every routed request is logged (:class:`RequestRecord`) under a kind:

=============== ====================================================
``list``        GET of pods (all namespaces or one), not watching
``watch``       the same with ``watch=true``
``event``       POST of an Event
``event_list``  GET of Events (all namespaces or one), not watching
``event_watch`` the same with ``watch=true``
``node_list``   GET /api/v1/nodes, not watching
``node_watch``  the same with ``watch=true``
``node_get``    GET of one Node (or its ``/status``)
``node_status`` PATCH of a Node's ``/status``
``lease``       any request under .../leases (GET, POST, PUT)
=============== ====================================================

Faults, for everyone: the next N requests of a kind (optionally of one HTTP
method) answer a code with a ``Status`` body (a ``Retry-After`` if asked; for
watches optionally as a 200 stream carrying one ERROR event), or wait some
seconds before being served normally (a slow server: a write served late still
lands). A *throttle* lets at most N requests of a kind through in each second
and answers the rest 429 with a ``Retry-After``, for as long as it is set (the
real server's priority and fairness turning a flow away).

Per client: a *cut-off* matches every request whose User-Agent contains a
substring, until restored. It is checked before anything else (it takes no
fault meant for others), and either answers a status (503 by default), or
hangs the request for ``hang_s`` seconds (or until restored or the server
stops) and then drops the connection without serving it: a partition, where
the request never reached the server. The client's watches already open go
silent while it is cut off in hang mode, and are cut (no terminating chunk)
in status mode.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field
from typing import Literal, TypeVar, get_args

RequestKind = Literal[
    "list",
    "watch",
    "event",
    "event_list",
    "event_watch",
    "node_list",
    "node_watch",
    "node_get",
    "node_status",
    "lease",
    "claim_list",
    "claim_watch",
    "claim_get",
    "taint_rule_list",
    "taint_rule",
    "slice_list",
    "slice_watch",
    "discovery",
]
REQUEST_KINDS: tuple[str, ...] = get_args(RequestKind)
WATCH_KINDS = ("watch", "node_watch", "event_watch", "claim_watch", "slice_watch")


@dataclass(frozen=True, kw_only=True)
class RequestRecord:
    """One request the server received (before any injected failure)."""

    kind: RequestKind
    path: str
    query: dict[str, str]
    at: float  # time.monotonic()
    peer: int = 0  # the client's port: one TCP connection per distinct value
    method: str = "GET"
    user_agent: str = ""
    cut_off: bool = False  # answered by a per-client cut-off, never served


@dataclass(frozen=True, kw_only=True)
class Fault:
    code: int
    retry_after: int | None
    in_stream: bool
    method: str | None  # None: a request of the kind with any method


@dataclass(frozen=True, kw_only=True)
class CutOff:
    """Every request whose User-Agent contains ``agent`` fails, until restored."""

    agent: str
    status: int
    retry_after: int | None
    hang_s: float | None  # set: hang this long, then drop the connection unserved


@dataclass(frozen=True, kw_only=True)
class Admission:
    """What to do with one request: cut it off, fail it, or serve it (after ``hang`` s)."""

    cut: CutOff | None = None
    fault: Fault | None = None
    hang: float = 0.0


@dataclass(kw_only=True)
class _Hang:
    seconds: float
    method: str | None


_T = TypeVar("_T", Fault, _Hang)


@dataclass(kw_only=True)
class Faults:
    """Guarded by the server's shared lock (``cond``)."""

    cond: threading.Condition
    _faults: dict[str, list[Fault]] = field(
        default_factory=lambda: {kind: [] for kind in REQUEST_KINDS}
    )
    _hangs: dict[str, list[_Hang]] = field(
        default_factory=lambda: {kind: [] for kind in REQUEST_KINDS}
    )
    _cuts: list[CutOff] = field(default_factory=list)
    _requests: list[RequestRecord] = field(default_factory=list)
    # kind -> (requests a second let through, Retry-After of the rest); the count so far
    # in the current second of time.monotonic(), per kind.
    _throttles: dict[str, tuple[int, int]] = field(default_factory=dict)
    _admitted: dict[str, tuple[int, int]] = field(default_factory=dict)

    def fail_next(
        self,
        kind: RequestKind,
        code: int,
        *,
        count: int = 1,
        retry_after: int | None = None,
        in_stream: bool = False,
        method: str | None = None,
    ) -> None:
        _check_kind(kind)
        fault = Fault(
            code=code,
            retry_after=retry_after,
            in_stream=in_stream,
            method=method.upper() if method else None,
        )
        with self.cond:
            self._faults[kind].extend([fault] * count)

    def hang_next(
        self, kind: RequestKind, seconds: float, *, count: int = 1, method: str | None = None
    ) -> None:
        _check_kind(kind)
        hang = _Hang(seconds=seconds, method=method.upper() if method else None)
        with self.cond:
            self._hangs[kind].extend([hang] * count)

    def throttle(self, kind: RequestKind, per_second: int, *, retry_after: int = 1) -> None:
        """Let at most ``per_second`` requests of ``kind`` through in each second and
        answer the rest 429 with ``retry_after``, as the real server's priority and
        fairness does to a flow over its share (0: stop throttling ``kind``)."""
        _check_kind(kind)
        with self.cond:
            if per_second <= 0:
                self._throttles.pop(kind, None)
            else:
                self._throttles[kind] = (per_second, retry_after)

    def _throttled(self, kind: str) -> Fault | None:
        limit = self._throttles.get(kind)
        if limit is None:
            return None
        second = int(time.monotonic())
        at, count = self._admitted.get(kind, (second, 0))
        if at != second:
            count = 0
        if count >= limit[0]:
            return Fault(code=429, retry_after=limit[1], in_stream=False, method=None)
        self._admitted[kind] = (second, count + 1)
        return None

    def clear(self) -> None:
        """Drop pending faults and hangs (cut-offs stay until restored)."""
        with self.cond:
            for pending in (*self._faults.values(), *self._hangs.values()):
                pending.clear()

    def cut_off(
        self,
        agent: str,
        *,
        status: int = 503,
        retry_after: int | None = None,
        hang_s: float | None = None,
    ) -> None:
        if not agent:
            raise ValueError("cut_off needs a non-empty User-Agent substring")
        with self.cond:
            self._cuts = [c for c in self._cuts if c.agent != agent]
            self._cuts.append(
                CutOff(agent=agent, status=status, retry_after=retry_after, hang_s=hang_s)
            )
            self.cond.notify_all()

    def restore(self, agent: str | None = None) -> None:
        """End the cut-off of ``agent`` (the substring given to cut_off), or of every client."""
        with self.cond:
            self._cuts = [c for c in self._cuts if agent is not None and c.agent != agent]
            self.cond.notify_all()

    def cut_for(self, user_agent: str) -> CutOff | None:
        with self.cond:
            return next((c for c in self._cuts if c.agent in user_agent), None)

    def is_active(self, cut: CutOff) -> bool:
        with self.cond:
            return cut in self._cuts

    def admit(self, record: RequestRecord) -> Admission:
        """Log ``record`` and decide its fate: a cut-off first, then a fault, then a hang."""
        with self.cond:
            cut = self.cut_for(record.user_agent)
            if cut is not None:
                self._requests.append(dataclasses.replace(record, cut_off=True))
                return Admission(cut=cut)
            self._requests.append(record)
            fault = self._throttled(record.kind) or _take(self._faults[record.kind], record.method)
            if fault is not None:
                return Admission(fault=fault)
            hang = _take(self._hangs[record.kind], record.method)
            return Admission(hang=hang.seconds if hang is not None else 0.0)

    def requests(self, kind: RequestKind | None = None) -> list[RequestRecord]:
        with self.cond:
            return [r for r in self._requests if kind is None or r.kind == kind]


def _take(pending: list[_T], method: str) -> _T | None:
    for i, item in enumerate(pending):
        if item.method is None or item.method == method:
            return pending.pop(i)
    return None


def _check_kind(kind: str) -> None:
    if kind not in REQUEST_KINDS:
        raise ValueError(f"unknown request kind {kind!r} (known: {', '.join(REQUEST_KINDS)})")
