"""The reconcile cycle's contract (readiness proposal §1 and its test strategy),
run identically on the simulator and on the real NVML backend over the fake library.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capwatch.agent.gpus import GpuBackend, GpuErrorClass, PowerConstraints, WriteResult
from capwatch.agent.ownership import FILE_NAME, OwnershipStore
from capwatch.agent.reconciling import Reconciler
from capwatch.agent.reports import (
    AbortReason,
    CapSource,
    ClampDirection,
    CycleFailureKind,
    Outcome,
    Reason,
    SafeDefaultCause,
)
from capwatch.kit.clock import FakeClock
from tests.contract.conftest import POD_A, POD_B, POD_C, POD_D, POD_E, SAFE_W, make_reconciler
from tests.contract.rigs import DEFAULT_W, MAX_W, UUIDS, Op, Rig, Write
from tests.fakes.pods import StaticPodView

NON_K8S = None


def test_clean_cycle_enforces_busy_gpus_and_leaves_idle_ones(rig: Rig, reconciler: Reconciler):
    """Busy GPUs get their pods' cap; an idle GPU is reported idle and never written."""
    rig.run(0, {1001: POD_A.ref.uid})
    rig.run(1, {1002: POD_A.ref.uid, 1003: POD_B.ref.uid})
    report = reconciler.reconcile_once()
    assert report.enforced
    g0, g1, g2 = report.gpus
    assert (g0.outcome, g0.cap_source, g0.applied_watts) == (
        Outcome.ENFORCED,
        CapSource.ANNOTATION,
        350,
    )
    assert g0.owners == (POD_A.ref,)
    assert (g1.outcome, g1.cap_source, g1.applied_watts) == (
        Outcome.ENFORCED,
        CapSource.AGREED,
        350,
    )
    assert g1.owners == (POD_A.ref, POD_B.ref)
    assert (g2.outcome, g2.reason) == (Outcome.IDLE, Reason.IDLE)
    assert rig.writes() == [
        Write(index=0, milliwatts=350_000, ok=True),
        Write(index=1, milliwatts=350_000, ok=True),
    ]
    assert [g.uuid for g in report.gpus] == list(UUIDS)


def test_clean_return_is_not_success(rig: Rig, reconciler: Reconciler):
    """A write the library rejected fails the cycle although the backend call returned normally."""
    rig.run(0, {1001: POD_A.ref.uid})
    rig.fail(Op.SET_LIMIT, 0, GpuErrorClass.NO_PERMISSION)
    written = rig.backend.set_limit(0, uuid=UUIDS[0], milliwatts=350_000)  # returns, no raise
    assert isinstance(written, WriteResult)
    assert not written.ok
    report = reconciler.reconcile_once()
    assert not report.enforced
    g0 = report.gpus[0]
    assert (g0.outcome, g0.reason, g0.error_class) == (
        Outcome.FAILED,
        Reason.WRITE_FAILED,
        GpuErrorClass.NO_PERMISSION,
    )
    assert g0.applied_watts is None
    assert rig.writes()[-1] == Write(index=0, milliwatts=350_000, ok=False)
    assert rig.limit_mw(0) == DEFAULT_W * 1000


@pytest.mark.parametrize(
    "error",
    [
        GpuErrorClass.NO_PERMISSION,
        GpuErrorClass.NOT_SUPPORTED,
        GpuErrorClass.GPU_IS_LOST,
        GpuErrorClass.INVALID_ARGUMENT,
        GpuErrorClass.TIMEOUT,
        GpuErrorClass.UNKNOWN,
        GpuErrorClass.UNINITIALIZED,
    ],
)
def test_every_write_error_class_fails_the_cycle(
    rig: Rig, reconciler: Reconciler, error: GpuErrorClass
):
    """Each NVML error class on the write reaches the report, classified."""
    rig.run(0, {1001: POD_A.ref.uid})
    rig.fail(Op.SET_LIMIT, 0, error)
    report = reconciler.reconcile_once()
    assert not report.enforced
    assert report.gpus[0].error_class is error
    assert report.failure_summary == "gpu0:write_failed"


@pytest.mark.parametrize(
    ("op", "reason"),
    [
        (Op.UUID, Reason.UUID_READ_FAILED),
        (Op.PROCESSES, Reason.PROCESS_LIST_FAILED),
        (Op.CONSTRAINTS, Reason.CONSTRAINTS_READ_FAILED),
        (Op.SET_LIMIT, Reason.WRITE_FAILED),
    ],
)
def test_failure_on_gpu0_still_reconciles_gpus_1_to_n(
    rig: Rig, reconciler: Reconciler, op: Op, reason: Reason
):
    """Every per-GPU failure class fails the cycle, and the fold goes on to the other GPUs."""
    for index in range(3):
        rig.run(index, {1001 + index: POD_A.ref.uid})
    rig.fail(op, 0, GpuErrorClass.GPU_IS_LOST)
    report = reconciler.reconcile_once()
    assert not report.enforced
    assert (report.gpus[0].outcome, report.gpus[0].reason) == (Outcome.FAILED, reason)
    assert [g.outcome for g in report.gpus[1:]] == [Outcome.ENFORCED, Outcome.ENFORCED]
    assert {w.index for w in rig.writes() if w.ok} == {1, 2}


def test_device_count_failure_fails_the_cycle_but_keeps_the_last_count(
    rig: Rig, reconciler: Reconciler
):
    """A failed device-count refresh fails the cycle; the GPUs are still reconciled."""
    rig.run(1, {1001: POD_A.ref.uid})
    rig.fail(Op.DEVICE_COUNT, None, GpuErrorClass.UNKNOWN)
    report = reconciler.reconcile_once()
    assert not report.enforced
    assert [f.kind for f in report.failures] == [CycleFailureKind.DEVICE_COUNT_FAILED]
    assert len(report.gpus) == 3
    assert report.gpus[1].outcome is Outcome.ENFORCED


def test_identity_change_before_the_write_skips_it_and_fails(
    rig: Rig, reconciler: Reconciler, store: OwnershipStore
):
    """A GPU re-enumerated between its UUID read and its write is not written, and fails;
    the claim made before the write is undone (nothing was written)."""
    rig.run(0, {1001: POD_A.ref.uid})
    rig.change_uuid_before_write(0, "GPU-ffffffff-0000-4000-8000-000000000000")
    report = reconciler.reconcile_once()
    assert not report.enforced
    assert report.gpus[0].reason is Reason.IDENTITY_MISMATCH
    assert rig.writes() == []
    assert store.get(UUIDS[0]) is None


def test_a_refused_write_leaves_an_earlier_claim_as_it_was(
    rig: Rig, reconciler: Reconciler, store: OwnershipStore
):
    """A capped GPU whose next write is refused for identity keeps its record unchanged
    (owner and target of the write that did take effect)."""
    rig.run(0, {1001: POD_A.ref.uid})
    reconciler.reconcile_once()
    before = store.get(UUIDS[0])
    assert before is not None
    rig.run(0, {1001: POD_A.ref.uid, 1005: POD_E.ref.uid})  # would change owners and target
    rig.change_uuid_before_write(0, "GPU-ffffffff-0000-4000-8000-000000000000")
    assert reconciler.reconcile_once().gpus[0].reason is Reason.IDENTITY_MISMATCH
    assert store.get(UUIDS[0]) == before


def test_pod_view_failure_aborts_before_the_gpu_loop(
    rig: Rig, reconciler: Reconciler, pods: StaticPodView
):
    """An unsynced pod view aborts the cycle: no GPU touched, caps left as they are."""
    rig.run(0, {1001: POD_A.ref.uid})
    pods.set_unsynced("watch down")
    report = reconciler.reconcile_once()
    assert not report.enforced
    assert report.abort_reason is AbortReason.POD_VIEW_NOT_SYNCED
    assert report.gpus == ()
    assert rig.writes() == []
    assert rig.limit_mw(0) == DEFAULT_W * 1000


def test_idle_gpus_are_never_written_and_do_not_fail(rig: Rig, reconciler: Reconciler):
    """With no compute processes anywhere, nothing is written and the cycle is enforced."""
    report = reconciler.reconcile_once()
    assert report.enforced
    assert [g.outcome for g in report.gpus] == [Outcome.IDLE] * 3
    assert rig.writes() == []


def test_safe_default_is_enforced_and_the_cycle_succeeds(rig: Rig, reconciler: Reconciler):
    """Missing, invalid or absent pod annotations fall back to the safe default, which counts."""
    rig.run(0, {1001: POD_C.ref.uid})
    rig.run(1, {1002: POD_D.ref.uid})
    rig.run(2, {1003: NON_K8S})
    report = reconciler.reconcile_once()
    assert report.enforced
    assert [g.safe_default_cause for g in report.gpus] == [
        SafeDefaultCause.MISSING,
        SafeDefaultCause.INVALID,
        SafeDefaultCause.NO_POD,
    ]
    assert {g.applied_watts for g in report.gpus} == {SAFE_W}
    assert all(rig.limit_mw(i) == SAFE_W * 1000 for i in range(3))


def test_disagreeing_pods_and_clamping(rig: Rig, reconciler: Reconciler):
    """Pods that disagree get the safe default; a request above the maximum is clamped."""
    rig.run(0, {1001: POD_A.ref.uid, 1002: POD_E.ref.uid})
    rig.run(1, {1003: POD_E.ref.uid})
    report = reconciler.reconcile_once()
    assert report.enforced
    assert report.gpus[0].safe_default_cause is SafeDefaultCause.DISAGREE
    g1 = report.gpus[1]
    assert (g1.requested_watts, g1.applied_watts, g1.clamp) == (
        5000,
        MAX_W,
        ClampDirection.LOWERED_TO_MAX,
    )


def test_owner_gone_releases_the_gpu(rig: Rig, reconciler: Reconciler, store: OwnershipStore):
    """A GPU the agent capped goes back to its default limit once its pods' processes leave."""
    rig.run(0, {1001: POD_A.ref.uid})
    assert reconciler.reconcile_once().enforced
    assert store.get(UUIDS[0]) is not None
    rig.run(0, {})
    report = reconciler.reconcile_once()
    assert report.enforced
    assert (report.gpus[0].outcome, report.gpus[0].applied_watts) == (Outcome.RELEASED, DEFAULT_W)
    assert rig.limit_mw(0) == DEFAULT_W * 1000
    assert store.get(UUIDS[0]) is None
    # Released once: the next cycle finds an ordinary idle GPU.
    assert reconciler.reconcile_once().gpus[0].outcome is Outcome.IDLE


def test_failed_release_fails_the_cycle_and_is_retried(
    rig: Rig, reconciler: Reconciler, store: OwnershipStore
):
    """A release whose write fails keeps ownership, fails the cycle, and succeeds later."""
    rig.run(0, {1001: POD_A.ref.uid})
    reconciler.reconcile_once()
    rig.run(0, {})
    rig.fail(Op.RESTORE, 0, GpuErrorClass.NO_PERMISSION)
    report = reconciler.reconcile_once()
    assert not report.enforced
    assert report.gpus[0].reason is Reason.RELEASE_FAILED
    assert store.get(UUIDS[0]) is not None
    rig.clear_faults()
    assert reconciler.reconcile_once().gpus[0].outcome is Outcome.RELEASED


def test_skipped_restore_fails_the_cycle(rig: Rig, reconciler: Reconciler, store: OwnershipStore):
    """A release skipped because the device's identity changed leaves a cap live: a failure."""
    rig.run(0, {1001: POD_A.ref.uid})
    reconciler.reconcile_once()
    rig.run(0, {})
    rig.change_uuid_before_write(0, "GPU-eeeeeeee-0000-4000-8000-000000000000")
    report = reconciler.reconcile_once()
    assert not report.enforced
    assert report.gpus[0].reason is Reason.RELEASE_DEFERRED
    assert store.get(UUIDS[0]) is not None


class _Exploding:
    """A backend wrapper whose process listing on one GPU raises an unexpected error."""

    def __init__(self, inner: GpuBackend, index: int) -> None:
        self._inner, self._index = inner, index

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def processes(self, index: int) -> tuple[int, ...]:
        if index == self._index:
            raise RuntimeError("bug in a backend")
        return self._inner.processes(index)


def test_unexpected_exception_fails_its_gpu_and_the_fold_goes_on(
    rig: Rig, pods: StaticPodView, store: OwnershipStore, clock: FakeClock, tmp_path: Path
):
    """An exception inside one GPU's step fails that GPU only; the others are reconciled."""
    rig.run(0, {1001: POD_A.ref.uid})
    rig.run(1, {1002: POD_A.ref.uid})
    rig.backend = _Exploding(rig.backend, 0)  # type: ignore[misc]
    reconciler = make_reconciler(rig, pods, store, clock, tmp_path / "proc")
    report = reconciler.reconcile_once()
    assert not report.enforced
    assert report.gpus[0].reason is Reason.INTERNAL_ERROR
    assert report.gpus[1].outcome is Outcome.ENFORCED


class _ShutdownAfterWrite:
    """Requests shutdown right after the write on GPU ``index`` returns (a SIGTERM mid-cycle)."""

    def __init__(self, inner: GpuBackend, index: int) -> None:
        self._inner, self._index = inner, index
        self.reconciler: Reconciler | None = None

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def set_limit(self, index: int, *, uuid: str, milliwatts: int) -> WriteResult:
        result = self._inner.set_limit(index, uuid=uuid, milliwatts=milliwatts)
        if index == self._index and self.reconciler is not None:
            self.reconciler.request_shutdown()
        return result

    def constraints(self, index: int) -> PowerConstraints:
        return self._inner.constraints(index)


def test_shutdown_before_the_cycle_returns_clean_and_touches_nothing(
    rig: Rig, reconciler: Reconciler
):
    """The fast-path short-circuit returns the (empty) fold: enforced, nothing written."""
    rig.run(0, {1001: POD_A.ref.uid})
    reconciler.request_shutdown()
    report = reconciler.reconcile_once()
    assert report.interrupted
    assert report.enforced
    assert rig.writes() == []


@pytest.mark.parametrize("gpu0_fails", [False, True])
def test_shutdown_mid_loop_returns_the_fold_so_far(
    rig: Rig,
    pods: StaticPodView,
    store: OwnershipStore,
    clock: FakeClock,
    tmp_path: Path,
    gpu0_fails: bool,
):
    """A mid-loop shutdown keeps a clean prefix enforced, and never launders a failure."""
    for index in range(3):
        rig.run(index, {1001 + index: POD_A.ref.uid})
    if gpu0_fails:
        rig.fail(Op.SET_LIMIT, 0, GpuErrorClass.GPU_IS_LOST)
    wrapper = _ShutdownAfterWrite(rig.backend, 0)
    rig.backend = wrapper  # type: ignore[misc]
    reconciler = make_reconciler(rig, pods, store, clock, tmp_path / "proc")
    wrapper.reconciler = reconciler
    report = reconciler.reconcile_once()
    assert report.interrupted
    assert len(report.gpus) == 1
    assert report.enforced is not gpu0_fails
    assert {w.index for w in rig.writes()} == {0}


def test_persistence_failure_stays_outside_the_cycle_result(
    rig: Rig, reconciler: Reconciler, store: OwnershipStore, tmp_path: Path
):
    """A state directory that cannot be written leaves the cycle enforced (for fewer than
    UNSAVED_CYCLES_LIMIT cycles in a row); the flush is retried."""
    (tmp_path / "state").write_text("not a directory")
    rig.run(0, {1001: POD_A.ref.uid})
    report = reconciler.reconcile_once()
    assert report.enforced
    assert store.pending
    (tmp_path / "state").unlink()
    assert reconciler.reconcile_once().enforced
    assert not store.pending


def test_restart_releases_what_a_previous_agent_capped(
    rig: Rig, pods: StaticPodView, clock: FakeClock, tmp_path: Path
):
    """A new agent reads the record a dead one left and releases its now-idle GPU."""
    state = tmp_path / "state"
    first = OwnershipStore(state, clock=clock)
    rig.run(1, {1001: POD_A.ref.uid})
    assert make_reconciler(rig, pods, first, clock, tmp_path / "proc").reconcile_once().enforced
    assert rig.limit_mw(1) == 350_000
    # The first agent dies without restoring; its pod goes away meanwhile.
    rig.run(1, {})
    second = OwnershipStore(state, clock=clock)
    report = make_reconciler(rig, pods, second, clock, tmp_path / "proc").reconcile_once()
    assert report.enforced
    assert report.gpus[1].outcome is Outcome.RELEASED
    assert rig.limit_mw(1) == DEFAULT_W * 1000
    assert json.loads((state / FILE_NAME).read_text())["gpus"] == {}


def test_unreadable_record_releases_every_idle_gpu_once(
    rig: Rig, pods: StaticPodView, store: OwnershipStore, clock: FakeClock, tmp_path: Path
):
    """After an unreadable record, idle GPUs are restored once: a dead agent may have capped one."""
    state = tmp_path / "state"
    state.mkdir()
    (state / FILE_NAME).write_text("\x00garbage")
    reconciler = make_reconciler(rig, pods, store, clock, tmp_path / "proc")
    first = reconciler.reconcile_once()
    assert first.enforced
    assert [g.outcome for g in first.gpus] == [Outcome.RELEASED] * 3
    assert [g.outcome for g in reconciler.reconcile_once().gpus] == [Outcome.IDLE] * 3


def test_unknown_pod_gets_the_safe_default(rig: Rig, reconciler: Reconciler):
    """A process whose pod the view does not know (yet) is capped at the safe default."""
    stranger = "bbbbbbbb-0000-4000-8000-000000000009"
    rig.run(0, {1001: stranger})
    report = reconciler.reconcile_once()
    assert report.enforced
    g0 = report.gpus[0]
    assert g0.safe_default_cause is SafeDefaultCause.MISSING
    assert [o.uid for o in g0.owners] == [stranger]


def test_restore_all_restores_every_owned_gpu(
    rig: Rig, reconciler: Reconciler, store: OwnershipStore
):
    """The shutdown sweep puts every GPU the agent capped back to its default limit."""
    rig.run(0, {1001: POD_A.ref.uid})
    rig.run(2, {1002: POD_C.ref.uid})
    reconciler.reconcile_once()
    results = reconciler.restore_all()
    assert sorted((r.index, r.outcome) for r in results) == [
        (0, Outcome.RELEASED),
        (2, Outcome.RELEASED),
    ]
    assert [rig.limit_mw(i) for i in range(3)] == [DEFAULT_W * 1000] * 3
    assert store.records() == {}
    assert not store.pending
