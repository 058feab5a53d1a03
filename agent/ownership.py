"""Which GPUs this agent capped, for which pods, at what target — durably.

The record lets a restarted agent release caps that a dead one left behind,
so a cap must never be in force without being on disk:

* every claim that changes the record is persisted (:mod:`capwatch.agent.durable`:
  atomic, fsync'd, mode 0600) *before* the cap write it precedes. A crash at
  any instant then leaves at worst a record of a cap that was never written,
  and restoring a default that was never changed is harmless;
* a release (default restored) and an undone claim are persisted at the end
  of the cycle, on every path, an aborted cycle's included: until then the
  record over-states what is capped, which is the safe direction;
* a failed save keeps the in-memory record and is retried on the next
  :meth:`OwnershipStore.flush`. Enforcement goes on (a cap the record does
  not hold is still better than no cap), but the store counts failed saves
  and the reconciler fails the cycle once the record could not be saved for
  :data:`UNSAVED_CYCLES_LIMIT` cycles in a row, so readiness says
  ``state-unwritable`` until a save succeeds.

Reading the record at start: a missing record is a first start. Anything
else that cannot be read as a record of this format -- not JSON, JSON of
the wrong shape or nesting, an unknown version, a directory or a symbolic
link at its path, or an I/O error reading it -- is *unreadable*: it is moved
aside (``ownership.json.unreadable-<time>``) for an operator to inspect and
the agent starts with an empty record, restoring the default on every idle
GPU once (it cannot know what a dead agent capped). An unreadable record is
never overwritten blindly: if it cannot even be moved aside, every save is
refused (and counted) until it can be, which turns into ``state-unwritable``
readiness. Starting anyway keeps caps enforced, where refusing to start would
leave a dead agent's caps in place and enforce nothing.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from capwatch.agent.durable import read_regular, remove_temporaries, write_atomically
from capwatch.agent.pods import PodRef
from capwatch.kit.clock import Clock
from capwatch.kit.errors import OwnershipError

log = logging.getLogger(__name__)

FILE_NAME = "ownership.json"
FORMAT_VERSION = 1
# Cycles in a row whose record could not be saved before readiness says so.
UNSAVED_CYCLES_LIMIT = 3


@dataclass(frozen=True, kw_only=True)
class OwnershipRecord:
    uuid: str
    index: int
    owners: tuple[PodRef, ...]
    target_milliwatts: int
    since_wall: float


class LoadStatus(str, Enum):
    EMPTY = "empty"  # no record: first start on this node
    LOADED = "loaded"
    UNREADABLE = "unreadable"  # a record existed but could not be read; moved aside


class MalformedRecord(ValueError):
    """The record's bytes are not an ownership record of this format."""


class OwnershipStore:
    """Thread-safe in-memory ownership with atomic, retried persistence.

    ``state_dir`` None keeps the record in memory only: a pool's simulated nodes,
    whose GPUs die with the process anyway.
    """

    def __init__(self, state_dir: Path | None, *, clock: Clock) -> None:
        self._path = None if state_dir is None else state_dir / FILE_NAME
        self._clock = clock
        self._lock = threading.Lock()
        self._records: dict[str, OwnershipRecord] = {}
        self._dirty = False
        self._blocked_by_unreadable = False
        self.flush_failures = 0  # every failed save since start
        self.consecutive_flush_failures = 0  # failed saves since the last one that worked
        self.last_flush_error = ""

    @property
    def path(self) -> Path | None:
        return self._path

    def load(self) -> LoadStatus:
        """Read the record left by a previous agent. Call once, at start; never raises."""
        if self._path is None:
            return LoadStatus.EMPTY
        for stale in remove_temporaries(self._path):
            log.info("removed a temporary file an interrupted save left path=%s", stale)
        try:
            records = _decode(read_regular(self._path))
        except FileNotFoundError:
            return LoadStatus.EMPTY
        except (OSError, MalformedRecord) as exc:
            log.error("ownership record unreadable path=%s error=%s", self._path, exc)
            self._set_aside()
            return LoadStatus.UNREADABLE
        with self._lock:
            self._records = records
        return LoadStatus.LOADED

    def _set_aside(self) -> None:
        assert self._path is not None
        aside = self._path.with_name(f"{FILE_NAME}.unreadable-{int(self._clock.wall())}")
        try:
            os.replace(self._path, aside)
        except FileNotFoundError:
            self._blocked_by_unreadable = False  # gone meanwhile: nothing left to protect
            return
        except OSError as exc:
            log.error("cannot move unreadable record aside path=%s error=%s", self._path, exc)
            self._blocked_by_unreadable = True
            return
        log.warning("moved unreadable ownership record aside to=%s", aside)
        self._blocked_by_unreadable = False

    def records(self) -> Mapping[str, OwnershipRecord]:
        with self._lock:
            return dict(self._records)

    def get(self, uuid: str) -> OwnershipRecord | None:
        with self._lock:
            return self._records.get(uuid)

    def claim(
        self, *, uuid: str, index: int, owners: tuple[PodRef, ...], target_milliwatts: int
    ) -> bool:
        """Record that this agent is about to cap ``uuid``; True if the record changed.

        A changed record must be flushed before the write it announces.
        """
        with self._lock:
            old = self._records.get(uuid)
            if old and old.owners == owners and old.target_milliwatts == target_milliwatts:
                if old.index == index:
                    return False
                self._records[uuid] = _replace_index(old, index)
                self._dirty = True
                return True
            since = old.since_wall if old else self._clock.wall()
            self._records[uuid] = OwnershipRecord(
                uuid=uuid,
                index=index,
                owners=owners,
                target_milliwatts=target_milliwatts,
                since_wall=since,
            )
            self._dirty = True
            return True

    def reinstate(self, uuid: str, record: OwnershipRecord | None) -> None:
        """Put back what the record held for ``uuid`` before a claim (None: nothing)."""
        with self._lock:
            if self._records.get(uuid) == record:
                return
            if record is None:
                self._records.pop(uuid, None)
            else:
                self._records[uuid] = record
            self._dirty = True

    def release(self, uuid: str) -> None:
        with self._lock:
            if self._records.pop(uuid, None) is not None:
                self._dirty = True

    @property
    def pending(self) -> bool:
        """True while the file lags behind the in-memory record."""
        with self._lock:
            return self._dirty

    def flush(self) -> bool:
        """Persist if anything changed. Returns False (and logs) on failure; never raises."""
        with self._lock:
            if not self._dirty:
                return True
            if self._path is None:
                self._dirty = False
                return True
            if self._blocked_by_unreadable:
                self._set_aside()
                if self._blocked_by_unreadable:
                    return self._failed("an unreadable record could not be moved aside")
            try:
                write_atomically(self._path, _encode(self._records))
            except OSError as exc:
                log.warning("ownership flush failed, will retry path=%s error=%s", self._path, exc)
                return self._failed(f"{type(exc).__name__}: {exc}")
            self._dirty = False
            self.consecutive_flush_failures = 0
            self.last_flush_error = ""
            return True

    def _failed(self, error: str) -> bool:
        self.flush_failures += 1
        self.consecutive_flush_failures += 1
        self.last_flush_error = error
        return False


def read_records(state_dir: Path) -> dict[str, OwnershipRecord]:
    """The record as the agent last persisted it, for another reader: no side effects
    (an unreadable record is reported, not moved aside; that is the agent's call)."""
    path = state_dir / FILE_NAME
    try:
        raw = read_regular(path)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise OwnershipError(f"cannot read {path}: {exc}") from exc
    try:
        return _decode(raw)
    except MalformedRecord as exc:
        raise OwnershipError(f"{path} is unreadable: {exc}") from exc


def _replace_index(record: OwnershipRecord, index: int) -> OwnershipRecord:
    return OwnershipRecord(
        uuid=record.uuid,
        index=index,
        owners=record.owners,
        target_milliwatts=record.target_milliwatts,
        since_wall=record.since_wall,
    )


def _encode(records: Mapping[str, OwnershipRecord]) -> bytes:
    doc = {
        "version": FORMAT_VERSION,
        "gpus": {
            uuid: {
                "index": r.index,
                "target_milliwatts": r.target_milliwatts,
                "since": r.since_wall,
                "owners": [
                    {"namespace": p.namespace, "name": p.name, "uid": p.uid} for p in r.owners
                ],
            }
            for uuid, r in sorted(records.items())
        },
    }
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def _decode(raw: bytes) -> dict[str, OwnershipRecord]:
    """Parse and check every field's type; raises MalformedRecord, nothing else."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
        raise MalformedRecord(f"not JSON: {exc}") from None
    doc = _object(doc, "the record")
    if doc.get("version") != FORMAT_VERSION:
        raise MalformedRecord(f"unsupported ownership format version {doc.get('version')!r}")
    records: dict[str, OwnershipRecord] = {}
    for uuid, value in _object(doc.get("gpus"), "gpus").items():
        where = f"gpus[{uuid}]"
        entry = _object(value, where)
        owners = tuple(
            PodRef(
                namespace=_string(fields.get("namespace"), f"{where}.owners[{i}].namespace"),
                name=_string(fields.get("name"), f"{where}.owners[{i}].name"),
                uid=_string(fields.get("uid"), f"{where}.owners[{i}].uid"),
            )
            for i, owner in enumerate(_list(entry.get("owners"), f"{where}.owners"))
            for fields in (_object(owner, f"{where}.owners[{i}]"),)
        )
        records[uuid] = OwnershipRecord(
            uuid=uuid,
            index=_natural(entry.get("index"), f"{where}.index"),
            owners=owners,
            target_milliwatts=_natural(entry.get("target_milliwatts"), f"{where}.target"),
            since_wall=_number(entry.get("since"), f"{where}.since"),
        )
    return records


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MalformedRecord(f"{what}: an object, not {type(value).__name__}")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise MalformedRecord(f"{what}: a list, not {type(value).__name__}")
    return value


def _string(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise MalformedRecord(f"{what}: a string, not {type(value).__name__}")
    return value


def _natural(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise MalformedRecord(f"{what}: an integer >= 0, not {value!r:.40}")
    return value


def _number(value: Any, what: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise MalformedRecord(f"{what}: a finite number, not {value!r:.40}")
    return float(value)
