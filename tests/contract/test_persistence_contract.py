"""The ownership record's crash-safety contract, on both backends: a cap is on disk before
it is written, every cycle path saves, and a record that cannot be saved shows in readiness.
"""

from __future__ import annotations

import json
from pathlib import Path

from capwatch.agent.gpus import GpuBackend, GpuErrorClass, PowerConstraints, WriteResult
from capwatch.agent.hub import Hub
from capwatch.agent.ownership import FILE_NAME, UNSAVED_CYCLES_LIMIT, OwnershipStore, read_records
from capwatch.agent.reconciling import Reconciler
from capwatch.agent.reports import CycleFailureKind, Outcome, Reason
from capwatch.kit.clock import FakeClock
from capwatch.kit.readiness import ReadinessReason
from tests.contract.conftest import POD_A, POD_C, make_reconciler
from tests.contract.rigs import DEFAULT_W, Op, Rig
from tests.fakes.pods import StaticPodView


class _RecordAtWrite:
    """Delegates to the rig's backend; reads the record from disk as each write starts."""

    def __init__(self, inner: GpuBackend, state: Path) -> None:
        self._inner = inner
        self._state = state
        self.seen: list[tuple[int, int | None]] = []  # (target asked, target on disk)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def constraints(self, index: int) -> PowerConstraints:
        return self._inner.constraints(index)

    def set_limit(self, index: int, *, uuid: str, milliwatts: int) -> WriteResult:
        record = read_records(self._state).get(uuid)
        self.seen.append((milliwatts, None if record is None else record.target_milliwatts))
        return self._inner.set_limit(index, uuid=uuid, milliwatts=milliwatts)


def test_a_changed_claim_is_on_disk_before_its_write(
    rig: Rig, pods: StaticPodView, store: OwnershipStore, clock: FakeClock, tmp_path: Path
):
    """Every cap write finds its own target already in the persisted record: a kill -9 right
    after the write leaves a record a restarted agent releases from."""
    wrapper = _RecordAtWrite(rig.backend, tmp_path / "state")
    rig.backend = wrapper  # type: ignore[misc]
    reconciler = make_reconciler(rig, pods, store, clock, tmp_path / "proc")
    rig.run(0, {1001: POD_A.ref.uid})
    rig.run(1, {1002: POD_C.ref.uid})
    assert reconciler.reconcile_once().enforced
    rig.run(0, {1003: POD_C.ref.uid})  # a new owner and target on GPU 0
    assert reconciler.reconcile_once().enforced
    # Cycle 1: GPU 0 at A's 350 W, GPU 1 at the safe default; cycle 2: both at the default.
    assert wrapper.seen == [(350_000, 350_000), (250_000, 250_000)] + [(250_000, 250_000)] * 2


def test_an_unchanged_claim_writes_nothing_to_disk(
    rig: Rig, reconciler: Reconciler, tmp_path: Path
):
    """Steady state costs no save: the record file is not replaced while nothing changes."""
    rig.run(0, {1001: POD_A.ref.uid})
    assert reconciler.reconcile_once().enforced
    record = tmp_path / "state" / FILE_NAME
    inode = record.stat().st_ino
    for _ in range(3):
        assert reconciler.reconcile_once().enforced
    assert record.stat().st_ino == inode


def test_an_aborted_cycle_still_saves(
    rig: Rig, pods: StaticPodView, reconciler: Reconciler, store: OwnershipStore, tmp_path: Path
):
    """A claim that could not be saved is saved by the next cycle even when that cycle aborts
    on an unsynced pod view (the API server down): the abort path flushes too."""
    state = tmp_path / "state"
    state.write_text("a file where the directory should be")
    rig.run(0, {1001: POD_A.ref.uid})
    assert reconciler.reconcile_once().enforced
    assert store.pending
    state.unlink()
    pods.set_unsynced("watch lost")
    report = reconciler.reconcile_once()
    assert report.abort_reason is not None
    assert not store.pending
    assert set(read_records(state)) == {rig.backend.uuid(0)}


def test_a_shutdown_short_circuit_still_saves(
    rig: Rig, reconciler: Reconciler, store: OwnershipStore, tmp_path: Path
):
    """A cycle cut short by a shutdown before its first GPU saves what is pending."""
    state = tmp_path / "state"
    state.write_text("not a directory")
    rig.run(0, {1001: POD_A.ref.uid})
    reconciler.reconcile_once()
    state.unlink()
    reconciler.request_shutdown()
    assert reconciler.reconcile_once().interrupted
    assert not store.pending


def test_an_unsaved_record_fails_readiness_after_a_few_cycles_and_recovers(
    rig: Rig, reconciler: Reconciler, store: OwnershipStore, clock: FakeClock, tmp_path: Path
):
    """A state dir that cannot be written keeps caps enforced but, after UNSAVED_CYCLES_LIMIT
    cycles in a row, fails the cycle with state_unwritable (readiness: state-unwritable);
    the first save that works makes the next cycle enforced again."""
    hub = Hub(clock=clock, stale_after_s=45)
    state = tmp_path / "state"
    state.write_text("not a directory")
    rig.run(0, {1001: POD_A.ref.uid})
    reports = []
    for _ in range(UNSAVED_CYCLES_LIMIT):
        reports.append(reconciler.reconcile_once())
        hub.publish(reports[-1])
    assert [r.unsaved_cycles for r in reports] == list(range(1, UNSAVED_CYCLES_LIMIT + 1))
    assert [r.enforced for r in reports] == [True] * (UNSAVED_CYCLES_LIMIT - 1) + [False]
    last = reports[-1]
    assert [f.kind for f in last.failures] == [CycleFailureKind.STATE_UNWRITABLE]
    assert last.gpus[0].outcome is Outcome.ENFORCED  # the cap itself is in force
    assert last.save_failures >= 1
    readiness = hub.readiness()
    assert (readiness.ready, readiness.reason) == (False, ReadinessReason.STATE_UNWRITABLE)
    assert "state_unwritable" in readiness.detail

    state.unlink()
    recovered = reconciler.reconcile_once()
    hub.publish(recovered)
    assert recovered.enforced
    assert recovered.unsaved_cycles == 0
    assert hub.readiness().ready
    assert not store.pending


def test_a_gpu_failure_and_an_unsaved_record_both_show(
    rig: Rig, reconciler: Reconciler, tmp_path: Path
):
    """With a failing write too, the reason is still state-unwritable and the summary names
    both, so neither hides the other."""
    (tmp_path / "state").write_text("not a directory")
    rig.run(0, {1001: POD_A.ref.uid})
    rig.run(1, {1002: POD_A.ref.uid})
    rig.fail(Op.SET_LIMIT, 1, GpuErrorClass.NO_PERMISSION)
    for _ in range(UNSAVED_CYCLES_LIMIT):
        report = reconciler.reconcile_once()
    assert report.failure_summary == "state_unwritable,gpu1:write_failed"


def test_the_shutdown_sweep_visits_every_gpu_when_one_restore_raises(
    rig: Rig, pods: StaticPodView, store: OwnershipStore, clock: FakeClock, tmp_path: Path
):
    """A restore that raises (a driver bug, an unexpected library error) on one GPU fails that
    GPU only: the sweep goes on and restores the others."""

    class _RaisingRestore:
        def __init__(self, inner: GpuBackend) -> None:
            self._inner = inner

        def __getattr__(self, name: str):
            return getattr(self._inner, name)

        def constraints(self, index: int) -> PowerConstraints:
            return self._inner.constraints(index)

        def restore_default(self, index: int, *, uuid: str) -> WriteResult:
            if index == 0:
                raise RuntimeError("driver exploded")
            return self._inner.restore_default(index, uuid=uuid)

    for index in range(3):
        rig.run(index, {1001 + index: POD_A.ref.uid})
    rig.backend = _RaisingRestore(rig.backend)  # type: ignore[misc]
    reconciler = make_reconciler(rig, pods, store, clock, tmp_path / "proc")
    assert reconciler.reconcile_once().enforced
    results = sorted(reconciler.restore_all(), key=lambda r: r.index)
    assert [(r.index, r.outcome, r.reason) for r in results] == [
        (0, Outcome.FAILED, Reason.INTERNAL_ERROR),
        (1, Outcome.RELEASED, Reason.RELEASED),
        (2, Outcome.RELEASED, Reason.RELEASED),
    ]
    assert [rig.limit_mw(i) for i in (1, 2)] == [DEFAULT_W * 1000] * 2
    assert set(json.loads((tmp_path / "state" / FILE_NAME).read_text())["gpus"]) == {
        rig.backend.uuid(0)
    }
