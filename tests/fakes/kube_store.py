"""The state behind the fake Kubernetes API server: pods, resourceVersions, history.

Mirrors what the real API server's watch cache does closely enough for a
list+watch client: one global resourceVersion bumped by every write, a bounded
event history that watches replay from, compaction (a watch from before the
oldest retained version is answered 410 Gone), field selectors applied to both
lists and watches (an object that stops matching is sent as DELETED, one that
starts matching as ADDED), and consistent paged lists (``limit``/``continue``
serve the snapshot the first page was taken from). Also the shapes of the
non-pod wire objects: ``Status`` failures, watch objects, bookmarks.
"""

from __future__ import annotations

import base64
import binascii
import copy
import itertools
import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

Pod = dict[str, Any]

# Fields the fake can select on, as the real server names them.
_FIELD_GETTERS = {
    "spec.nodeName": lambda pod: pod["spec"].get("nodeName", ""),
    "metadata.name": lambda pod: pod["metadata"]["name"],
    "metadata.namespace": lambda pod: pod["metadata"]["namespace"],
    "status.phase": lambda pod: pod["status"].get("phase", ""),
}


class SelectorError(ValueError):
    """An unsupported or malformed field selector (the server answers 400)."""


class ExpiredError(Exception):
    """A resourceVersion or continue token older than the retained history (410)."""


@dataclass(frozen=True, kw_only=True)
class FieldSelector:
    """A conjunction of ``field=value``, ``field==value`` and ``field!=value`` terms."""

    terms: tuple[tuple[str, str, bool], ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> FieldSelector:
        if not text:
            return cls()
        terms = []
        for raw in text.split(","):
            term = raw.strip()
            negate = "!=" in term
            sep = "!=" if negate else ("==" if "==" in term else "=")
            field, found, value = term.partition(sep)
            if not found or not field:
                raise SelectorError(f"invalid selector: {term!r}")
            if field not in _FIELD_GETTERS:
                raise SelectorError(
                    f'field label not supported: "{field}"'
                    f" (supported: {', '.join(sorted(_FIELD_GETTERS))})"
                )
            terms.append((field, value, negate))
        return cls(terms=tuple(terms))

    def matches(self, pod: Pod | None) -> bool:
        if pod is None:
            return False
        return all(
            (_FIELD_GETTERS[field](pod) == value) != negate for field, value, negate in self.terms
        )


@dataclass(frozen=True, kw_only=True)
class HistoryEvent:
    """One write: the object after it (``obj``) and before it (``old``)."""

    rv: int
    type: str  # ADDED, MODIFIED or DELETED, as seen by an unfiltered watch
    obj: Pod
    old: Pod | None


@dataclass(frozen=True, kw_only=True)
class ListPage:
    items: list[Pod]
    resource_version: int
    continue_token: str
    remaining: int


class PodStore:
    """Pods keyed by (namespace, name), with a global resourceVersion and history.

    All methods are thread-safe. ``cond`` is a Condition over a re-entrant lock:
    watch handlers wait on it, and ``atomic()`` lets a test make several changes
    that no watcher can observe half-done.
    """

    def __init__(self, *, history_limit: int = 1000, start_rv: int = 100) -> None:
        self.cond = threading.Condition(threading.RLock())
        self._rv = start_rv
        self._oldest_rv = start_rv  # watches from an rv below this get 410
        self._pods: dict[tuple[str, str], Pod] = {}
        self._history: list[HistoryEvent] = []
        self._history_limit = history_limit
        self._snapshots: dict[str, tuple[int, list[Pod]]] = {}
        self._snapshot_ids = itertools.count(1)

    @contextmanager
    def atomic(self) -> Iterator[None]:
        with self.cond:
            yield

    @property
    def resource_version(self) -> int:
        with self.cond:
            return self._rv

    @property
    def oldest_rv(self) -> int:
        with self.cond:
            return self._oldest_rv

    # -- writes -----------------------------------------------------------------

    def add_pod(
        self,
        namespace: str,
        name: str,
        *,
        node: str,
        annotations: dict[str, str] | None = None,
        phase: str = "Running",
        uid: str | None = None,
    ) -> Pod:
        with self.cond:
            key = (namespace, name)
            if key in self._pods:
                raise ValueError(f"pod {namespace}/{name} already exists")
            self._rv += 1
            pod: Pod = {
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "uid": uid or str(uuid.uuid4()),
                    "resourceVersion": str(self._rv),
                    "creationTimestamp": "2025-01-01T00:00:00Z",
                    "annotations": dict(annotations or {}),
                },
                "spec": {
                    "nodeName": node,
                    "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                },
                "status": {"phase": phase},
            }
            self._pods[key] = pod
            self._record("ADDED", pod, None)
            return copy.deepcopy(pod)

    def update_pod(
        self,
        namespace: str,
        name: str,
        *,
        annotations: dict[str, str] | None = None,
        node: str | None = None,
        phase: str | None = None,
    ) -> Pod:
        """Replace the given fields (annotations wholesale) and bump the rv."""
        with self.cond:
            old = self._pods[(namespace, name)]
            pod = copy.deepcopy(old)
            self._rv += 1
            pod["metadata"]["resourceVersion"] = str(self._rv)
            if annotations is not None:
                pod["metadata"]["annotations"] = dict(annotations)
            if node is not None:
                pod["spec"]["nodeName"] = node
            if phase is not None:
                pod["status"]["phase"] = phase
            self._pods[(namespace, name)] = pod
            self._record("MODIFIED", pod, old)
            return copy.deepcopy(pod)

    def delete_pod(self, namespace: str, name: str) -> None:
        with self.cond:
            old = self._pods.pop((namespace, name))
            self._rv += 1
            gone = copy.deepcopy(old)
            gone["metadata"]["resourceVersion"] = str(self._rv)
            self._record("DELETED", gone, old)

    def compact(self) -> None:
        """Forget all history: a watch from any rv before now is answered 410.

        Paged-list snapshots are dropped too, so a pending ``continue`` expires.
        """
        with self.cond:
            self._history.clear()
            self._snapshots.clear()
            self._oldest_rv = self._rv
            self.cond.notify_all()

    def _record(self, kind: str, obj: Pod, old: Pod | None) -> None:
        self._history.append(HistoryEvent(rv=self._rv, type=kind, obj=obj, old=old))
        if len(self._history) > self._history_limit:
            dropped = self._history.pop(0)
            self._oldest_rv = dropped.rv
        self.cond.notify_all()

    # -- reads ------------------------------------------------------------------

    def list_page(self, selector: FieldSelector, *, limit: int, token: str) -> ListPage:
        """One page of a consistent list. Raises ExpiredError for a stale token."""
        with self.cond:
            if token:
                snap_id, offset = _decode_continue(token)
                if snap_id not in self._snapshots:
                    raise ExpiredError("the provided continue parameter is too old")
                rv, items = self._snapshots[snap_id]
            else:
                rv = self._rv
                items = sorted(
                    (p for p in self._pods.values() if selector.matches(p)),
                    key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]),
                )
                items = copy.deepcopy(items)
                snap_id, offset = "", 0
            end = len(items) if limit <= 0 else min(len(items), offset + limit)
            page = items[offset:end]
            next_token = ""
            if end < len(items):
                if not snap_id:
                    snap_id = str(next(self._snapshot_ids))
                    self._snapshots[snap_id] = (rv, items)
                next_token = _encode_continue(snap_id, end, rv)
            return ListPage(
                items=page,
                resource_version=rv,
                continue_token=next_token,
                remaining=len(items) - end,
            )

    def current_matching(self, selector: FieldSelector) -> list[Pod]:
        with self.cond:
            return [copy.deepcopy(p) for p in self._pods.values() if selector.matches(p)]

    def events_after(
        self, cursor: int, selector: FieldSelector
    ) -> tuple[list[tuple[str, Pod]], int]:
        """Watch events after ``cursor`` as a filtered watch sees them, and the new cursor.

        Raises ExpiredError when ``cursor`` predates the retained history.
        Caller holds ``cond``.
        """
        if cursor < self._oldest_rv:
            raise ExpiredError(f"too old resource version: {cursor} ({self._oldest_rv})")
        out: list[tuple[str, Pod]] = []
        for event in self._history:
            if event.rv <= cursor:
                continue
            new_match = event.type != "DELETED" and selector.matches(event.obj)
            old_match = selector.matches(event.old)
            if new_match and old_match:
                out.append(("MODIFIED", copy.deepcopy(event.obj)))
            elif new_match:
                out.append(("ADDED", copy.deepcopy(event.obj)))
            elif old_match:
                # Stopped matching or deleted: the last state the watcher could see,
                # stamped with the rv of the change (as the real watch cache does).
                last = copy.deepcopy(event.old)
                assert last is not None
                last["metadata"]["resourceVersion"] = str(event.rv)
                out.append(("DELETED", last))
        return out, max(cursor, self._rv)


def _encode_continue(snap_id: str, offset: int, rv: int) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "snap": snap_id, "start": offset, "rv": rv})
    return base64.urlsafe_b64encode(raw.encode()).decode()


def _decode_continue(token: str) -> tuple[str, int]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return str(data["snap"]), int(data["start"])
    except (ValueError, KeyError, TypeError, binascii.Error) as err:
        raise SelectorError(f"invalid continue token: {token!r}") from err


# -- wire objects -------------------------------------------------------------

_REASONS = {
    400: "BadRequest",
    404: "NotFound",
    405: "MethodNotAllowed",
    410: "Expired",
    429: "TooManyRequests",
    500: "InternalError",
}


def status_body(code: int, message: str, reason: str | None = None) -> dict[str, Any]:
    """A ``meta/v1 Status`` failure object, as the API server returns it."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or _REASONS.get(code, "Unknown"),
        "code": code,
    }


def watch_object(pod: Pod) -> Pod:
    """Watch events carry kind/apiVersion on the object; list items do not."""
    return {"kind": "Pod", "apiVersion": "v1", **pod}


def bookmark_object(rv: int) -> dict[str, Any]:
    return {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": str(rv)}}
