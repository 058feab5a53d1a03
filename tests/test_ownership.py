"""Ownership store: atomic persistence, recovery, and never overwriting an unreadable record."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from capwatch.agent import durable
from capwatch.agent.ownership import FILE_NAME, LoadStatus, OwnershipStore, read_records
from capwatch.agent.pods import PodRef
from capwatch.kit.clock import FakeClock
from capwatch.kit.errors import OwnershipError

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


WRONG_SHAPES = {
    "a list": "[]",
    "a string": '"ownership"',
    "a number": "42",
    "null": "null",
    "deep nesting": "[" * 100_000 + "]" * 100_000,
    "gpus a list": '{"version": 1, "gpus": []}',
    "gpus missing": '{"version": 1}',
    "entry a string": '{"version": 1, "gpus": {"GPU-a": "capped"}}',
    "index a bool": json.dumps(
        {
            "version": 1,
            "gpus": {"GPU-a": {"index": True, "target_milliwatts": 1, "since": 0, "owners": []}},
        }
    ),
    "negative target": json.dumps(
        {
            "version": 1,
            "gpus": {"GPU-a": {"index": 0, "target_milliwatts": -1, "since": 0, "owners": []}},
        }
    ),
    "since not finite": '{"version": 1, "gpus": {"GPU-a": {"index": 0, "target_milliwatts": 1,'
    ' "since": NaN, "owners": []}}}',
    "owners an object": json.dumps(
        {
            "version": 1,
            "gpus": {"GPU-a": {"index": 0, "target_milliwatts": 1, "since": 0, "owners": {}}},
        }
    ),
    "owner missing uid": json.dumps(
        {
            "version": 1,
            "gpus": {
                "GPU-a": {
                    "index": 0,
                    "target_milliwatts": 1,
                    "since": 0,
                    "owners": [{"namespace": "a", "name": "b"}],
                }
            },
        }
    ),
    "owner a number": json.dumps(
        {
            "version": 1,
            "gpus": {"GPU-a": {"index": 0, "target_milliwatts": 1, "since": 0, "owners": [7]}},
        }
    ),
}


@pytest.mark.parametrize("text", WRONG_SHAPES.values(), ids=WRONG_SHAPES.keys())
def test_json_of_the_wrong_shape_is_unreadable_not_a_crash(tmp_path: Path, text: str):
    """Valid JSON that is not a record (or nesting too deep to parse) is an unreadable record:
    moved aside at load, reported by read_records as an OwnershipError; never a crash."""
    (tmp_path / FILE_NAME).write_text(text)
    with pytest.raises(OwnershipError, match="unreadable"):
        read_records(tmp_path)
    assert store_at(tmp_path).load() is LoadStatus.UNREADABLE
    assert not (tmp_path / FILE_NAME).exists()
    assert len(list(tmp_path.glob(f"{FILE_NAME}.unreadable-*"))) == 1


def test_a_directory_at_the_record_path_is_unreadable_and_moved_aside(tmp_path: Path):
    """An I/O error reading the record (here: its path is a directory) is an unreadable record
    at start, not a crash: set aside, and the agent saves a fresh record after it."""
    (tmp_path / FILE_NAME).mkdir()
    store = store_at(tmp_path)
    assert store.load() is LoadStatus.UNREADABLE
    assert [p.is_dir() for p in tmp_path.glob(f"{FILE_NAME}.unreadable-*")] == [True]
    store.claim(uuid="GPU-a", index=0, owners=(POD,), target_milliwatts=1)
    assert store.flush()
    assert read_records(tmp_path).keys() == {"GPU-a"}


def test_a_symlink_at_the_record_path_is_not_followed(tmp_path: Path):
    """A link planted where the record goes is not read through; it is set aside, and the
    file it points at is left exactly as it was."""
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"version": 1, "gpus": {}}))
    state = tmp_path / "state"
    state.mkdir()
    (state / FILE_NAME).symlink_to(target)
    with pytest.raises(OwnershipError, match="symbolic link"):
        read_records(state)
    store = store_at(state)
    assert store.load() is LoadStatus.UNREADABLE
    store.claim(uuid="GPU-a", index=0, owners=(POD,), target_milliwatts=1)
    assert store.flush()
    assert json.loads(target.read_text()) == {"version": 1, "gpus": {}}
    assert not (state / FILE_NAME).is_symlink()


def test_the_temporary_file_never_follows_a_planted_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Even a link planted at the exact temporary name a save will use (its random part made
    predictable here) is never written through: the save fails and the target is untouched."""
    monkeypatch.setattr(durable.secrets, "token_hex", lambda _n: "predictable")
    victim = tmp_path / "victim"
    victim.write_text("precious")
    state = tmp_path / "state"
    state.mkdir()
    (state / f".{FILE_NAME}.tmp-predictable").symlink_to(victim)
    store = store_at(state)
    store.claim(uuid="GPU-a", index=0, owners=(POD,), target_milliwatts=1)
    assert not store.flush()
    assert victim.read_text() == "precious"
    assert store.consecutive_flush_failures == 1


def test_temporary_names_are_unpredictable(tmp_path: Path):
    """Two saves use two different temporary names (an attacker cannot pre-plant one)."""
    names: list[str] = []
    real = durable.os.replace

    def spy(src, dst):
        names.append(Path(src).name)
        return real(src, dst)

    store = store_at(tmp_path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(durable.os, "replace", spy)
        for target in (1, 2):
            store.claim(uuid="GPU-a", index=0, owners=(POD,), target_milliwatts=target)
            assert store.flush()
    assert len(set(names)) == 2
    assert all(n.startswith(f".{FILE_NAME}.tmp-") for n in names)


def test_record_is_private(tmp_path: Path):
    """The record names pods: it is written with mode 0600 whatever the umask."""
    old = os.umask(0)
    try:
        store = store_at(tmp_path)
        store.claim(uuid="GPU-a", index=0, owners=(POD,), target_milliwatts=1)
        assert store.flush()
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / FILE_NAME).stat().st_mode) == 0o600


def test_stale_temporaries_are_removed_at_load(tmp_path: Path):
    """Temporary files a killed agent left mid-save are removed at the next start; other files
    in the state dir are not touched."""
    (tmp_path / f".{FILE_NAME}.tmp-0123456789abcdef").write_text("half a rec")
    (tmp_path / f".{FILE_NAME}.tmp-{os.getpid()}").write_text("old-style name")
    (tmp_path / "forget").mkdir()
    store_at(tmp_path).load()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["forget"]


def test_consecutive_failures_reset_when_a_save_works(tmp_path: Path):
    """The consecutive count says how long the record has been unsaved; a save resets it
    (the total keeps counting)."""
    state = tmp_path / "state"
    store = store_at(state)
    state.write_text("not a directory")
    for target in (1, 2):
        store.claim(uuid="GPU-a", index=0, owners=(POD,), target_milliwatts=target)
        assert not store.flush()
    assert (store.flush_failures, store.consecutive_flush_failures) == (2, 2)
    assert store.last_flush_error
    state.unlink()
    assert store.flush()
    assert (store.flush_failures, store.consecutive_flush_failures) == (2, 0)


GOLDEN = Path(__file__).parent / "data" / "ownership-v1.json"


def test_the_record_format_is_pinned_across_upgrades_and_rollbacks(tmp_path: Path):
    """An upgraded agent adopts the caps its predecessor recorded, and a rolled-back one
    those its successor recorded: the record of format 1 as 0.1.0 wrote it loads, and
    saving it again writes the same bytes (a change to the encoder fails here first)."""
    (tmp_path / FILE_NAME).write_bytes(GOLDEN.read_bytes())
    store = store_at(tmp_path)
    assert store.load() is LoadStatus.LOADED
    records = store.records()
    assert {uuid: (r.index, r.target_milliwatts) for uuid, r in records.items()} == {
        "GPU-0b5e0000-0000-4000-8000-000000000000": (0, 250_000),
        "GPU-0b5e0000-0000-4000-8000-000000000003": (3, 300_000),
    }
    owners = records["GPU-0b5e0000-0000-4000-8000-000000000003"].owners
    assert [p.name for p in owners] == ["a", "b"]
    # Dirty it without changing it, so that a save writes the file anew.
    store.reinstate("GPU-0b5e0000-0000-4000-8000-000000000000", None)
    store.reinstate(
        "GPU-0b5e0000-0000-4000-8000-000000000000",
        records["GPU-0b5e0000-0000-4000-8000-000000000000"],
    )
    assert store.flush()
    assert (tmp_path / FILE_NAME).read_bytes() == GOLDEN.read_bytes()


def test_fields_a_later_version_adds_do_not_make_the_record_unreadable(tmp_path: Path):
    """Rolling back past a version that added a field (same format number) keeps the
    record: unknown keys are ignored, not a reason to start over."""
    doc = json.loads(GOLDEN.read_text())
    doc["written_by"] = "capwatch 0.2.0"
    for entry in doc["gpus"].values():
        entry["mode"] = "enforce"
    (tmp_path / FILE_NAME).write_text(json.dumps(doc))
    store = store_at(tmp_path)
    assert store.load() is LoadStatus.LOADED
    assert len(store.records()) == 2
