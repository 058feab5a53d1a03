"""Which GPUs this agent capped, for which pods, at what target — durably.

The record lets a restarted agent release caps that a dead one left behind.
It is written atomically (temporary file, fsync, rename, fsync of the
directory), so a crash leaves either the old record or the new one.

Persistence is deliberately outside the cycle's result: the in-memory record
is updated just before each cap write (a write may take effect even when it
fails or never returns) and when a release succeeds, and the file is flushed
at the end of the cycle; a failed flush is retried next cycle and only
logged. Live enforcement is correct either way; only a restarted agent would
notice.

An unreadable record is never overwritten blindly: it is first moved aside
(``ownership.json.unreadable-<time>``) for an operator to inspect, and if even
that fails the store refuses to write until it succeeds.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from agent.clock import Clock
from agent.errors import OwnershipError
from agent.pods import PodRef

log = logging.getLogger(__name__)

FILE_NAME = "ownership.json"
FORMAT_VERSION = 1


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


class OwnershipStore:
    """Thread-safe in-memory ownership with atomic, retried persistence."""

    def __init__(self, state_dir: Path, *, clock: Clock) -> None:
        self._path = state_dir / FILE_NAME
        self._clock = clock
        self._lock = threading.Lock()
        self._records: dict[str, OwnershipRecord] = {}
        self._dirty = False
        self._blocked_by_unreadable = False
        self.flush_failures = 0

    @property
    def path(self) -> Path:
        return self._path

    def load(self) -> LoadStatus:
        """Read the record left by a previous agent. Call once, at start."""
        try:
            raw = self._path.read_bytes()
        except FileNotFoundError:
            return LoadStatus.EMPTY
        except OSError as exc:
            raise OwnershipError(f"cannot read {self._path}: {exc}") from exc
        try:
            records = _decode(raw)
        except (ValueError, KeyError, TypeError) as exc:
            log.error("ownership record unreadable path=%s error=%s", self._path, exc)
            self._set_aside()
            return LoadStatus.UNREADABLE
        with self._lock:
            self._records = records
        return LoadStatus.LOADED

    def _set_aside(self) -> None:
        aside = self._path.with_name(f"{FILE_NAME}.unreadable-{int(self._clock.wall())}")
        try:
            os.replace(self._path, aside)
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
    ) -> None:
        with self._lock:
            old = self._records.get(uuid)
            if old and old.owners == owners and old.target_milliwatts == target_milliwatts:
                if old.index != index:
                    self._records[uuid] = _replace_index(old, index)
                    self._dirty = True
                return
            since = old.since_wall if old else self._clock.wall()
            self._records[uuid] = OwnershipRecord(
                uuid=uuid,
                index=index,
                owners=owners,
                target_milliwatts=target_milliwatts,
                since_wall=since,
            )
            self._dirty = True

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
            if self._blocked_by_unreadable:
                self._set_aside()
                if self._blocked_by_unreadable:
                    self.flush_failures += 1
                    return False
            payload = _encode(self._records)
            try:
                _atomic_write(self._path, payload)
            except OSError as exc:
                self.flush_failures += 1
                log.warning("ownership flush failed, will retry path=%s error=%s", self._path, exc)
                return False
            self._dirty = False
            return True


def read_records(state_dir: Path) -> dict[str, OwnershipRecord]:
    """The record as the agent last persisted it, for another reader: no side effects
    (an unreadable record is reported, not moved aside; that is the agent's call)."""
    path = state_dir / FILE_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise OwnershipError(f"cannot read {path}: {exc}") from exc
    try:
        return _decode(raw)
    except (ValueError, KeyError, TypeError) as exc:
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
    doc = json.loads(raw)
    if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION:
        raise ValueError(f"unsupported ownership format version {doc.get('version')!r}")
    gpus = doc["gpus"]
    if not isinstance(gpus, dict):
        raise TypeError("gpus must be an object")
    records: dict[str, OwnershipRecord] = {}
    for uuid, entry in gpus.items():
        owners = tuple(
            PodRef(namespace=str(o["namespace"]), name=str(o["name"]), uid=str(o["uid"]))
            for o in entry["owners"]
        )
        index, target = entry["index"], entry["target_milliwatts"]
        if not isinstance(index, int) or not isinstance(target, int):
            raise TypeError(f"gpu {uuid}: index and target_milliwatts must be integers")
        records[str(uuid)] = OwnershipRecord(
            uuid=str(uuid),
            index=index,
            owners=owners,
            target_milliwatts=target,
            since_wall=float(entry["since"]),
        )
    return records


def _atomic_write(path: Path, payload: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    # The rename is durable only once the directory entry is on disk.
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
