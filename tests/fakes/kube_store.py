"""The state behind the fake Kubernetes API server: one store per resource kind.

Mirrors what the real API server (etcd plus its watch cache) does closely
enough for list+watch clients and optimistic writers:

- one global resourceVersion (etcd's revision) shared by every kind and bumped
  by every write (:class:`ResourceVersions`), so versions from a pod list and a
  node list are comparable, as on a real cluster;
- per kind, a bounded event history that watches replay from, and compaction
  (a watch from before the oldest retained version is answered 410 Gone);
- selectors applied to lists and watches alike: an object that stops matching
  is sent as DELETED (its last matching state, stamped with the version of the
  change), one that starts matching as ADDED, as the real watch cache does;
- consistent paged lists: ``limit``/``continue`` serve the snapshot the first
  page was taken from; compaction expires pending ``continue`` tokens; a list
  at an exact earlier resourceVersion is rebuilt from the history (410 once
  that history is compacted);
- a write that changes nothing (only through the HTTP endpoints, which ask for
  it) leaves the resourceVersion as it is and sends no watch event.

Resource shapes live in the per-kind modules (kube_pods, kube_nodes,
kube_leases, kube_events); the wire shapes in kube_wire.
"""

from __future__ import annotations

import base64
import binascii
import copy
import itertools
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tests.fakes.kube_selectors import Selector, SelectorError

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped kinds


class ExpiredError(Exception):
    """A resourceVersion or continue token older than the retained history (410)."""


class StaleVersionError(Exception):
    """A write conditional on a resourceVersion that is no longer current (409 Conflict)."""


class ResourceVersions:
    """The resourceVersion sequence every kind shares, and the lock over all the state.

    ``cond`` is a Condition over a re-entrant lock: watch handlers wait on it,
    and ``atomic()`` lets a test make several changes no watcher sees half-done.
    """

    def __init__(self, start: int = 100) -> None:
        self.cond = threading.Condition(threading.RLock())
        self._rv = start

    @property
    def current(self) -> int:
        with self.cond:
            return self._rv

    def bump(self) -> int:
        with self.cond:
            self._rv += 1
            return self._rv

    @contextmanager
    def atomic(self) -> Iterator[None]:
        with self.cond:
            yield


@dataclass(frozen=True, kw_only=True)
class HistoryEvent:
    """One write: the object after it (``obj``) and before it (``old``)."""

    rv: int
    type: str  # ADDED, MODIFIED or DELETED, as seen by an unfiltered watch
    obj: Obj
    old: Obj | None


@dataclass(frozen=True, kw_only=True)
class ListPage:
    items: list[Obj]
    resource_version: int
    continue_token: str
    remaining: int


class ObjectStore:
    """Objects of one kind keyed by (namespace, name), with their watch history.

    Thread-safe; every method takes the shared lock. Objects go in and come out
    as deep copies, so no caller can change stored state behind the history.
    """

    def __init__(
        self,
        *,
        kind: str,
        api_version: str,
        versions: ResourceVersions,
        history_limit: int = 1000,
    ) -> None:
        self.kind = kind
        self.api_version = api_version
        self.versions = versions
        self.cond = versions.cond
        self._oldest_rv = versions.current  # watches from an rv below this get 410
        self._objects: dict[Key, Obj] = {}
        self._history: list[HistoryEvent] = []
        self._history_limit = history_limit
        self._snapshots: dict[str, tuple[int, list[Obj]]] = {}
        self._snapshot_ids = itertools.count(1)

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def resource_version(self) -> int:
        return self.versions.current

    @property
    def latest_change(self) -> int:
        """The resourceVersion of the newest write of this kind still in the history."""
        with self.cond:
            return self._history[-1].rv if self._history else self._oldest_rv

    @property
    def newest_object_rv(self) -> int:
        """The newest resourceVersion among the objects of this kind now (0: none)."""
        with self.cond:
            return max(
                (int(o["metadata"]["resourceVersion"]) for o in self._objects.values()), default=0
            )

    @property
    def oldest_rv(self) -> int:
        with self.cond:
            return self._oldest_rv

    # -- writes -----------------------------------------------------------------

    def get(self, key: Key) -> Obj | None:
        with self.cond:
            obj = self._objects.get(key)
            return None if obj is None else copy.deepcopy(obj)

    def keys(self) -> list[Key]:
        with self.cond:
            return sorted(self._objects)

    def create(self, key: Key, obj: Obj) -> Obj:
        """Store a new object at a new resourceVersion (ADDED). ValueError if it exists."""
        with self.cond:
            if key in self._objects:
                raise ValueError(f"{self.kind} {'/'.join(filter(None, key))} already exists")
            stored = copy.deepcopy(obj)
            stored["metadata"]["resourceVersion"] = str(self.versions.bump())
            self._objects[key] = stored
            self._record("ADDED", stored, None)
            return copy.deepcopy(stored)

    def replace(self, key: Key, obj: Obj, *, skip_unchanged: bool = False) -> Obj:
        """Replace an existing object (MODIFIED at a new resourceVersion). KeyError if absent.

        ``skip_unchanged``: as the real storage does, an object equal to the stored
        one (resourceVersion aside) is not written: same version, no watch event.
        """
        with self.cond:
            old = self._objects[key]
            stored = copy.deepcopy(obj)
            stored["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
            if skip_unchanged and stored == old:
                return copy.deepcopy(old)
            stored["metadata"]["resourceVersion"] = str(self.versions.bump())
            self._objects[key] = stored
            self._record("MODIFIED", stored, old)
            return copy.deepcopy(stored)

    def delete(self, key: Key) -> Obj:
        """Remove an object (DELETED at a new resourceVersion). KeyError if absent."""
        with self.cond:
            old = self._objects.pop(key)
            gone = copy.deepcopy(old)
            gone["metadata"]["resourceVersion"] = str(self.versions.bump())
            self._record("DELETED", gone, old)
            return copy.deepcopy(gone)

    def compact(self) -> None:
        """Forget all history: a watch from any rv before now is answered 410.

        Paged-list snapshots are dropped too, so a pending ``continue`` expires.
        """
        with self.cond:
            self._history.clear()
            self._snapshots.clear()
            self._oldest_rv = self.versions.current
            self.cond.notify_all()

    def _record(self, kind: str, obj: Obj, old: Obj | None) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        self._history.append(HistoryEvent(rv=rv, type=kind, obj=obj, old=old))
        if len(self._history) > self._history_limit:
            dropped = self._history.pop(0)
            self._oldest_rv = dropped.rv
        self.cond.notify_all()

    # -- reads ------------------------------------------------------------------

    def list_page(
        self, selector: Selector, *, limit: int, token: str, at_rv: int | None = None
    ) -> ListPage:
        """One page of a consistent list, of the current state or (``at_rv``) of the state
        at that resourceVersion. Raises ExpiredError for a stale token or version."""
        with self.cond:
            if token:
                snap_id, offset = _decode_continue(token)
                if snap_id not in self._snapshots:
                    raise ExpiredError(
                        "The provided continue parameter is too old to display a consistent"
                        " list result. You can start a new list without the continue"
                        " parameter."
                    )
                rv, items = self._snapshots[snap_id]
            else:
                rv = self.versions.current if at_rv is None else at_rv
                objects = self._objects if at_rv is None else self._state_at(at_rv)
                items = copy.deepcopy(
                    [objects[k] for k in sorted(objects) if selector.matches(objects[k])]
                )
                snap_id, offset = "", 0
            end = len(items) if limit <= 0 else min(len(items), offset + limit)
            page = items[offset:end]
            next_token = ""
            if end < len(items):
                if not snap_id:
                    snap_id = f"{self.kind}-{next(self._snapshot_ids)}"
                    self._snapshots[snap_id] = (rv, items)
                next_token = _encode_continue(snap_id, end, rv)
            return ListPage(
                items=page,
                resource_version=rv,
                continue_token=next_token,
                remaining=len(items) - end,
            )

    def _state_at(self, rv: int) -> dict[Key, Obj]:
        """The objects as they were at ``rv``, undoing the history after it (caller holds
        ``cond``). ExpiredError when that history is gone."""
        if rv < self._oldest_rv:
            raise ExpiredError("The resourceVersion for the provided list is too old.")
        objects = dict(self._objects)
        for event in reversed(self._history):
            if event.rv <= rv:
                break
            metadata = event.obj["metadata"]
            key = (metadata.get("namespace") or "", metadata["name"])
            if event.old is None:
                objects.pop(key, None)
            else:
                objects[key] = event.old
        return objects

    def current_matching(self, selector: Selector) -> list[Obj]:
        with self.cond:
            return [
                copy.deepcopy(self._objects[k])
                for k in sorted(self._objects)
                if selector.matches(self._objects[k])
            ]

    def events_after(self, cursor: int, selector: Selector) -> tuple[list[tuple[str, Obj]], int]:
        """Watch events after ``cursor`` as a filtered watch sees them, and the new cursor.

        Raises ExpiredError when ``cursor`` predates the retained history.
        Caller holds ``cond``.
        """
        if cursor < self._oldest_rv:
            raise ExpiredError(f"too old resource version: {cursor} ({self._oldest_rv})")
        out: list[tuple[str, Obj]] = []
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
        return out, max(cursor, self.versions.current)


def _encode_continue(snap_id: str, offset: int, rv: int) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "snap": snap_id, "start": offset, "rv": rv})
    return base64.urlsafe_b64encode(raw.encode()).decode()


def _decode_continue(token: str) -> tuple[str, int]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return str(data["snap"]), int(data["start"])
    except (ValueError, KeyError, TypeError, binascii.Error) as err:
        raise SelectorError(f"invalid continue token: {token!r}") from err
