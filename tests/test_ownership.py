"""Ownership store: atomic persistence, recovery, and never overwriting an unreadable record."""

from __future__ import annotations

import json
from pathlib import Path

from agent.clock import FakeClock
from agent.ownership import FILE_NAME, LoadStatus, OwnershipStore
from agent.pods import PodRef

POD = PodRef(namespace="ml", name="train-0", uid="0f5e6a2c-1111-4222-8333-944455556666")


def store_at(path: Path) -> OwnershipStore:
    return OwnershipStore(path, clock=FakeClock())


def test_claim_flush_and_reload_round_trip(tmp_path: Path):
    """A claimed GPU survives a restart: a new store loads what the old one flushed."""
    first = store_at(tmp_path)
    assert first.load() is LoadStatus.EMPTY
    first.claim(uuid="GPU-a", index=0, owners=(POD,), target_milliwatts=450_000)
    assert first.pending
    assert first.flush()
    assert not first.pending

    second = store_at(tmp_path)
    assert second.load() is LoadStatus.LOADED
    record = second.get("GPU-a")
    assert record is not None
    assert record.owners == (POD,)
    assert record.target_milliwatts == 450_000
    assert record.index == 0


def test_release_is_persisted(tmp_path: Path):
    """Releasing removes the record from the file too."""
    store = store_at(tmp_path)
    store.claim(uuid="GPU-a", index=0, owners=(POD,), target_milliwatts=450_000)
    store.flush()
    store.release("GPU-a")
    store.flush()
    doc = json.loads((tmp_path / FILE_NAME).read_text())
    assert doc["gpus"] == {}


def test_unchanged_claim_does_not_dirty(tmp_path: Path):
    """Re-claiming the same owners and target each cycle causes no write."""
    store = store_at(tmp_path)
    store.claim(uuid="GPU-a", index=0, owners=(POD,), target_milliwatts=450_000)
    store.flush()
    store.claim(uuid="GPU-a", index=0, owners=(POD,), target_milliwatts=450_000)
    assert not store.pending


def test_failed_flush_keeps_memory_and_retries(tmp_path: Path):
    """A flush that cannot write keeps the in-memory record and succeeds once it can."""
    state = tmp_path / "state"
    store = store_at(state)
    store.claim(uuid="GPU-a", index=0, owners=(POD,), target_milliwatts=450_000)
    state.write_text("a file where the directory should be")
    assert not store.flush()
    assert store.pending
    assert store.get("GPU-a") is not None
    assert store.flush_failures == 1
    state.unlink()
    assert store.flush()
    assert not store.pending


def test_unreadable_record_is_moved_aside_not_overwritten(tmp_path: Path):
    """Garbage in the record is preserved under a new name before anything is written."""
    path = tmp_path / FILE_NAME
    path.write_text("{not json")
    store = store_at(tmp_path)
    assert store.load() is LoadStatus.UNREADABLE
    aside = list(tmp_path.glob(f"{FILE_NAME}.unreadable-*"))
    assert len(aside) == 1
    assert aside[0].read_text() == "{not json"
    store.claim(uuid="GPU-a", index=0, owners=(POD,), target_milliwatts=450_000)
    assert store.flush()
    assert aside[0].read_text() == "{not json"


def test_unknown_version_is_unreadable(tmp_path: Path):
    """A record in a format this agent does not know is treated as unreadable, not guessed at."""
    (tmp_path / FILE_NAME).write_text(json.dumps({"version": 99, "gpus": {}}))
    assert store_at(tmp_path).load() is LoadStatus.UNREADABLE


def test_no_temporary_files_left_behind(tmp_path: Path):
    """The atomic write leaves only the record itself."""
    store = store_at(tmp_path)
    store.claim(uuid="GPU-a", index=0, owners=(POD,), target_milliwatts=1)
    store.flush()
    assert sorted(p.name for p in tmp_path.iterdir()) == [FILE_NAME]


def test_reinstate_puts_back_what_a_claim_replaced(tmp_path: Path):
    """A claim undone (its write was refused before writing) leaves the record as it was:
    absent stays absent, an earlier claim comes back with its own start time."""
    clock = FakeClock()
    store = OwnershipStore(tmp_path, clock=clock)
    store.claim(uuid="GPU-a", index=0, owners=(), target_milliwatts=300_000)
    before = store.get("GPU-a")
    clock.advance(5)
    store.claim(uuid="GPU-a", index=0, owners=(), target_milliwatts=250_000)
    store.reinstate("GPU-a", before)
    assert store.get("GPU-a") == before
    store.claim(uuid="GPU-b", index=1, owners=(), target_milliwatts=300_000)
    store.reinstate("GPU-b", None)
    assert store.get("GPU-b") is None
    assert store.flush()
    assert set(json.loads(store.path.read_text())["gpus"]) == {"GPU-a"}
