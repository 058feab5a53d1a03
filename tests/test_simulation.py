"""The simulated node: writes and limits, identity checks, faults by cycle, hangs, pods, procs."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from capwatch.agent.attribution import Attributor, FsProcRoot
from capwatch.agent.capping import DEFAULT_ANNOTATION_KEY
from capwatch.agent.gpus import GpuBackend, GpuError, GpuErrorClass, WriteOutcome, WriteResult
from capwatch.agent.ownership import OwnershipStore
from capwatch.agent.pods import PodView
from capwatch.agent.reconciling import Reconciler
from capwatch.agent.reports import CapSource, Outcome
from capwatch.agent.sim.claims import SimClaimView
from capwatch.agent.sim.proctree import CgroupLayout, ProcSpec, QosClass, cgroup_text
from capwatch.agent.sim.scenario import FaultOp, FaultSpec, PodSpec, Scenario, parse_scenario
from capwatch.agent.sim.scenario import default_scenario as builtin_scenario
from capwatch.agent.sim.views import SimGpuBackend, SimPodView
from capwatch.agent.sim.world import SimWorld, SimWrite, WriteKind
from capwatch.agent.stepping import Policy
from capwatch.kit.clock import FakeClock
from capwatch.kit.errors import PodViewError, ScenarioError

UID_A = "11111111-2222-4333-8444-555555555555"
UID_B = "66666666-7777-4888-8999-aaaaaaaaaaaa"
UID_C = "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9"
GPU0, GPU1 = "GPU-aaaa-0", "GPU-aaaa-1"


def scenario(**extra: Any) -> Scenario:
    """Two GPUs (100-400 W, default 400 W); pod A always on GPU 0, pod B in cycles 2-4 on GPU 1."""
    doc: dict[str, Any] = {
        "node_name": "n",
        "safe_default_watts": 300,
        "gpus": [
            {"uuid": GPU0, "min_watts": 100, "max_watts": 400, "default_watts": 400},
            {"uuid": GPU1, "min_watts": 100, "max_watts": 400, "default_watts": 400},
        ],
        "pods": [
            {"namespace": "ns", "name": "a", "uid": UID_A, "annotations": {"k": "250"}},
            {"namespace": "ns", "name": "b", "uid": UID_B, "cycles": {"from": 2, "to": 4}},
        ],
        "processes": [
            {"gpu": 0, "pid": 10, "pod": UID_A, "qos": "guaranteed"},
            {"gpu": 1, "pid": 20, "pod": UID_B, "cgroup_layout": "v1-cgroupfs-crio"},
            {"gpu": 1, "pid": 30},
            {"gpu": 1, "pid": 31, "cycles": {"from": 3}},
        ],
    }
    doc.update(extra)
    return parse_scenario(doc, source="test")


def failure(result: WriteResult) -> tuple[WriteOutcome, GpuErrorClass | None]:
    return result.outcome, result.error_class


def sim(**extra: Any) -> tuple[SimWorld, SimGpuBackend, SimPodView]:
    world = SimWorld(scenario(**extra))
    return world, SimGpuBackend(world), SimPodView(world)


def test_reads_report_the_scenario_in_milliwatts() -> None:
    """Count, UUIDs and constraints come from the file; watts become milliwatts."""
    world = SimWorld(scenario())
    backend: GpuBackend = SimGpuBackend(world)  # type-checks as the agent's protocols
    view: PodView = SimPodView(world)
    assert view.snapshot().pods
    assert backend.device_count() == 2
    assert [backend.uuid(0), backend.uuid(1)] == [GPU0, GPU1]
    c = backend.constraints(1)
    assert (c.min_milliwatts, c.max_milliwatts, c.default_milliwatts) == (100_000, 400_000, 400_000)
    assert world.limit_milliwatts(0) == 400_000  # starts at the default


def test_set_limit_and_restore_change_the_limit_and_are_logged() -> None:
    """An OK write carries the applied value, changes the limit and is logged with its cycle."""
    world, backend, _ = sim()
    world.begin_cycle(1)
    result = backend.set_limit(0, uuid=GPU0, milliwatts=250_000)
    assert result == WriteResult(outcome=WriteOutcome.OK, applied_milliwatts=250_000)
    assert world.limit_milliwatts(0) == 250_000
    assert world.limit_milliwatts(1) == 400_000
    world.begin_cycle(2)
    restored = backend.restore_default(0, uuid=GPU0)
    assert restored.ok
    assert restored.applied_milliwatts == 400_000
    assert world.limit_milliwatts(0) == 400_000
    ok = WriteOutcome.OK
    assert world.writes() == (
        SimWrite(cycle=1, index=0, uuid=GPU0, milliwatts=250_000, kind=WriteKind.SET, outcome=ok),
        SimWrite(
            cycle=2, index=0, uuid=GPU0, milliwatts=400_000, kind=WriteKind.RESTORE, outcome=ok
        ),
    )


@pytest.mark.parametrize("milliwatts", [99_999, 400_001, 0, -1])
def test_limit_outside_the_range_fails_as_nvml_would(milliwatts: int) -> None:
    """Outside [min, max]: FAILED with INVALID_ARGUMENT, and the limit stays."""
    world, backend, _ = sim()
    result = backend.set_limit(0, uuid=GPU0, milliwatts=milliwatts)
    assert failure(result) == (WriteOutcome.FAILED, GpuErrorClass.INVALID_ARGUMENT)
    assert result.applied_milliwatts is None
    assert world.limit_milliwatts(0) == 400_000
    assert world.writes()[-1].outcome is WriteOutcome.FAILED
    assert backend.set_limit(0, uuid=GPU0, milliwatts=100_000).ok  # the edges are settable
    assert backend.set_limit(0, uuid=GPU0, milliwatts=400_000).ok


def test_bad_index_is_invalid_argument_for_reads_and_unconfirmed_for_writes() -> None:
    """An index with no GPU fails like NVML's handle lookup and writes nothing."""
    world, backend, _ = sim()
    for read in (backend.uuid, backend.constraints, backend.processes):
        with pytest.raises(GpuError) as caught:
            read(2)
        assert caught.value.error_class is GpuErrorClass.INVALID_ARGUMENT
    result = backend.set_limit(2, uuid=GPU0, milliwatts=200_000)
    assert failure(result) == (WriteOutcome.IDENTITY_UNCONFIRMED, GpuErrorClass.INVALID_ARGUMENT)
    assert [world.limit_milliwatts(i) for i in (0, 1)] == [400_000, 400_000]


def test_uuid_change_to_makes_writes_bound_to_the_old_uuid_mismatch() -> None:
    """During a change_to fault the device reports the new UUID; old-UUID writes are refused."""
    world, backend, _ = sim(
        faults=[{"op": "uuid", "gpu": 0, "change_to": "GPU-new", "cycles": {"from": 2, "to": 2}}]
    )
    world.begin_cycle(2)
    assert backend.uuid(0) == "GPU-new"
    for result in (
        backend.set_limit(0, uuid=GPU0, milliwatts=200_000),
        backend.restore_default(0, uuid=GPU0),
    ):
        assert result.outcome is WriteOutcome.IDENTITY_MISMATCH
        assert "GPU-new" in result.detail
    assert world.limit_milliwatts(0) == 400_000
    assert backend.set_limit(0, uuid="GPU-new", milliwatts=200_000).ok  # bound to what it is now
    world.begin_cycle(3)
    assert backend.uuid(0) == GPU0
    assert backend.set_limit(0, uuid=GPU0, milliwatts=300_000).ok


def test_identity_check_only_change_is_invisible_to_plain_reads() -> None:
    """identity_check_only: uuid() keeps the old UUID, so the step's write mismatches."""
    world, backend, _ = sim(
        faults=[{"op": "uuid", "gpu": 0, "change_to": "GPU-new", "identity_check_only": True}]
    )
    world.begin_cycle(1)
    read = backend.uuid(0)
    assert read == GPU0
    result = backend.set_limit(0, uuid=read, milliwatts=200_000)
    assert result.outcome is WriteOutcome.IDENTITY_MISMATCH
    assert world.limit_milliwatts(0) == 400_000


def test_uuid_error_makes_writes_identity_unconfirmed() -> None:
    """A uuid error fault fails uuid() and makes the pre-write identity read fail: no write."""
    world, backend, _ = sim(faults=[{"op": "uuid", "gpu": 1, "error": "gpu_is_lost"}])
    with pytest.raises(GpuError) as caught:
        backend.uuid(1)
    assert caught.value.error_class is GpuErrorClass.GPU_IS_LOST
    result = backend.set_limit(1, uuid=GPU1, milliwatts=200_000)
    assert failure(result) == (WriteOutcome.IDENTITY_UNCONFIRMED, GpuErrorClass.GPU_IS_LOST)
    assert world.limit_milliwatts(1) == 400_000
    assert backend.set_limit(0, uuid=GPU0, milliwatts=200_000).ok  # other GPU unaffected


def test_identity_check_only_error_hits_only_the_write() -> None:
    """identity_check_only with an error: uuid() works, the write is IDENTITY_UNCONFIRMED."""
    _, backend, _ = sim(
        faults=[{"op": "uuid", "gpu": 0, "error": "timeout", "identity_check_only": True}]
    )
    assert backend.uuid(0) == GPU0
    result = backend.set_limit(0, uuid=GPU0, milliwatts=200_000)
    assert failure(result) == (WriteOutcome.IDENTITY_UNCONFIRMED, GpuErrorClass.TIMEOUT)


CALLS: dict[FaultOp, Callable[[SimGpuBackend, SimPodView], object]] = {
    FaultOp.DEVICE_COUNT: lambda b, _: b.device_count(),
    FaultOp.UUID: lambda b, _: b.uuid(1),
    FaultOp.PROCESSES: lambda b, _: b.processes(1),
    FaultOp.CONSTRAINTS: lambda b, _: b.constraints(1),
    FaultOp.SET_LIMIT: lambda b, _: b.set_limit(1, uuid=GPU1, milliwatts=200_000),
    FaultOp.RESTORE: lambda b, _: b.restore_default(1, uuid=GPU1),
    FaultOp.POD_VIEW: lambda _, v: v.snapshot(),
}


def _error_of(op: FaultOp, backend: SimGpuBackend, view: SimPodView) -> GpuErrorClass | None:
    """Perform ``op`` (on GPU 1); the error class it failed with, or None when it worked."""
    try:
        answer = CALLS[op](backend, view)
    except GpuError as exc:
        return exc.error_class
    except PodViewError as exc:
        return GpuErrorClass.UNKNOWN if "unknown" in str(exc) else None
    return answer.error_class if isinstance(answer, WriteResult) else None


@pytest.mark.parametrize("op", list(FaultOp))
def test_each_ops_error_fault_applies_only_within_its_cycles(op: FaultOp) -> None:
    """An error fault on cycles 2-3 fails that op in cycles 2 and 3 only, with its class."""
    fault: dict[str, Any] = {"op": op.value, "error": "unknown", "cycles": {"from": 2, "to": 3}}
    if op.per_gpu:
        fault["gpu"] = 1
    world, backend, view = sim(faults=[fault])
    failed = []
    for cycle in range(6):
        world.begin_cycle(cycle)
        if _error_of(op, backend, view) is GpuErrorClass.UNKNOWN:
            failed.append(cycle)
    assert failed == [2, 3]


@pytest.mark.parametrize("op", [FaultOp.SET_LIMIT, FaultOp.RESTORE])
def test_write_error_fault_returns_failed_and_keeps_the_limit(op: FaultOp) -> None:
    """A set_limit / restore fault returns FAILED with its error class; nothing is written."""
    world, backend, _ = sim()
    assert backend.set_limit(1, uuid=GPU1, milliwatts=300_000).ok
    world.add_fault(FaultSpec(op=op, gpu=1, error=GpuErrorClass.NO_PERMISSION))
    result = CALLS[op](backend, SimPodView(world))
    assert isinstance(result, WriteResult)
    assert failure(result) == (WriteOutcome.FAILED, GpuErrorClass.NO_PERMISSION)
    assert world.limit_milliwatts(1) == 300_000
    other = FaultOp.RESTORE if op is FaultOp.SET_LIMIT else FaultOp.SET_LIMIT
    assert _error_of(other, backend, SimPodView(world)) is None, "the fault is specific to its op"


def test_hang_blocks_for_its_duration_then_proceeds(caplog: pytest.LogCaptureFixture) -> None:
    """A hang fault delays the call by its seconds, then the write happens normally; a
    call on another GPU does not hang (the world logs every hang it sleeps through)."""
    world, backend, _ = sim(faults=[{"op": "set_limit", "gpu": 0, "hang": 0.2}])
    with caplog.at_level(logging.INFO, logger="capwatch.agent.sim.world"):
        start = time.monotonic()
        result = backend.set_limit(0, uuid=GPU0, milliwatts=200_000)
        elapsed = time.monotonic() - start
        assert backend.set_limit(1, uuid=GPU1, milliwatts=200_000).ok  # other GPU: no hang
    # Not sooner than the hang; the upper bound only says it ended (25 x the hang).
    assert 0.2 <= elapsed < 5.0
    assert result.ok
    assert world.limit_milliwatts(0) == 200_000
    hangs = [r.getMessage() for r in caplog.records if "sim fault hang" in r.getMessage()]
    assert len(hangs) == 1
    assert "op=set_limit gpu=0 " in hangs[0]


class EnteredHang(threading.Event):
    """A SimWorld's interrupt event that notes when a hang starts waiting on it."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.entered.set()
        return super().wait(timeout)


def test_interrupt_ends_a_hang_and_disarms_later_ones() -> None:
    """interrupt() wakes a call that is inside its 30 s hang (known to be, not given time
    to get there) at once; later hangs no longer block."""
    world, backend, _ = sim(faults=[{"op": "processes", "gpu": 1, "hang": 30}])
    hang = world.stop = EnteredHang()
    world.begin_cycle(3)
    out: list[tuple[int, ...]] = []
    worker = threading.Thread(target=lambda: out.append(backend.processes(1)))
    start = time.monotonic()
    worker.start()
    assert hang.entered.wait(5), "the call never reached its hang"
    assert worker.is_alive(), "the call is hung"
    world.interrupt()
    worker.join(timeout=5)
    assert not worker.is_alive()
    assert time.monotonic() - start < 5
    assert out == [(20, 30, 31)], "the interrupted call still proceeds"
    start = time.monotonic()
    backend.processes(1)
    assert time.monotonic() - start < 5  # a hang guard: armed, the hang would last 30 s


def test_processes_follow_their_cycle_ranges() -> None:
    """Processes are listed in the cycles they exist in; one without cycles follows its pod."""
    world, backend, _ = sim()
    listed = {}
    for cycle in range(7):
        world.begin_cycle(cycle)
        listed[cycle] = (backend.processes(0), backend.processes(1))
    assert all(gpu0 == (10,) for gpu0, _ in listed.values())
    gpu1 = [listed[c][1] for c in range(7)]
    assert gpu1 == [(30,), (30,), (20, 30), (20, 30, 31), (20, 30, 31), (30, 31), (30, 31)]


def test_pods_follow_their_cycle_ranges() -> None:
    """The pod view lists a pod only within its cycles, with its ref and annotations."""
    world, _, view = sim()
    seen = {}
    versions = set()
    for cycle in range(6):
        world.begin_cycle(cycle)
        snap = view.snapshot()
        seen[cycle] = sorted(snap.pods)
        versions.add(snap.resource_version)
    both = sorted([UID_A, UID_B])
    assert seen == {0: [UID_A], 1: [UID_A], 2: both, 3: both, 4: both, 5: [UID_A]}
    assert len(versions) == 6, "the resource version moves with the cycle"
    info = view.snapshot().get(UID_A)
    assert info is not None
    assert str(info.ref) == "ns/a"
    assert info.annotations == {"k": "250"}


def test_pod_view_error_fault_raises_pod_view_error() -> None:
    """A pod_view error fault makes snapshot() raise PodViewError naming the error class."""
    world, _, view = sim(faults=[{"op": "pod_view", "error": "timeout", "cycles": 2}])
    world.begin_cycle(2)
    with pytest.raises(PodViewError, match="timeout"):
        view.snapshot()
    world.begin_cycle(3)
    assert UID_A in view.snapshot().pods


def test_pod_view_hang_delays_the_snapshot() -> None:
    """A pod_view hang delays snapshot() and then returns the pods."""
    _, _, view = sim(faults=[{"op": "pod_view", "hang": 0.15}])
    start = time.monotonic()
    assert UID_A in view.snapshot().pods
    assert time.monotonic() - start >= 0.15


def test_materialised_proc_tree_attributes_every_process(tmp_path: Path) -> None:
    """Every process gets its cgroup file, and the real attribution maps it back to its pod."""
    world = SimWorld(scenario())
    root = tmp_path / "proc"
    world.materialise_procs(root)
    assert world.proc_root == root
    assert sorted(int(p.name) for p in root.iterdir()) == [10, 20, 30, 31]
    expected = ProcSpec(pid=20, pod_uid=UID_B, layout=CgroupLayout.V1_CGROUPFS_CRIO)
    assert (root / "20" / "cgroup").read_text() == cgroup_text(expected)
    guaranteed = ProcSpec(pid=10, pod_uid=UID_A, qos=QosClass.GUARANTEED)
    assert (root / "10" / "cgroup").read_text() == cgroup_text(guaranteed)
    attributor = Attributor(FsProcRoot(root))
    assert attributor.pod_uids([10, 20, 30, 31]) == {10: UID_A, 20: UID_B, 30: None, 31: None}


def test_set_processes_replaces_a_gpus_processes_and_writes_their_cgroups(tmp_path: Path) -> None:
    """'GPU 1 now runs pid 4242 of pod C': listed in every cycle and attributable."""
    world, backend, view = sim()
    world.materialise_procs(tmp_path)
    world.add_pod(PodSpec(namespace="ns", name="c", uid=UID_C))
    world.set_processes(1, {4242: UID_C, 4243: None})
    for cycle in (0, 3, 100):
        world.begin_cycle(cycle)
        assert backend.processes(1) == (4242, 4243)
        assert backend.processes(0) == (10,)
        assert UID_C in view.snapshot().pods
    attributor = Attributor(FsProcRoot(tmp_path))
    assert attributor.pod_uids([4242, 4243]) == {4242: UID_C, 4243: None}
    world.remove_pod(UID_C)
    assert UID_C not in view.snapshot().pods
    assert backend.processes(1) == (4242, 4243), "a process may outlive its pod"


def test_runtime_mutation_rejects_bad_input() -> None:
    """Mutations name what was wrong instead of corrupting the world."""
    world, backend, _ = sim()
    with pytest.raises(ScenarioError) as caught:
        world.set_processes(2, {1: None})
    assert caught.value.option == "set_processes.gpu"
    with pytest.raises(ScenarioError, match="pod_uid"):
        world.set_processes(0, {1: "not-a-uuid"})
    with pytest.raises(ScenarioError, match="pid"):
        world.set_processes(0, {0: None})
    assert backend.processes(0) == (10,), "a rejected mutation changes nothing"
    with pytest.raises(ScenarioError) as caught:
        world.add_fault(FaultSpec(op=FaultOp.UUID, gpu=5, hang_seconds=1))
    assert caught.value.option == "add_fault.gpu"
    with pytest.raises(ScenarioError, match="already exists"):
        world.add_pod(PodSpec(namespace="x", name="y", uid=UID_A))
    with pytest.raises(ScenarioError, match="no pod"):
        world.remove_pod(UID_C)


def test_add_fault_and_clear_faults_switch_faults_at_run_time() -> None:
    """add_fault applies from now on; clear_faults removes it and the scenario's own faults."""
    world, backend, _ = sim(faults=[{"op": "constraints", "gpu": 0, "error": "not_supported"}])
    world.begin_cycle(1)
    assert backend.set_limit(0, uuid=GPU0, milliwatts=200_000).ok
    world.add_fault(FaultSpec(op=FaultOp.SET_LIMIT, gpu=0, error=GpuErrorClass.NO_PERMISSION))
    assert backend.set_limit(0, uuid=GPU0, milliwatts=300_000).error_class is (
        GpuErrorClass.NO_PERMISSION
    )
    with pytest.raises(GpuError):
        backend.constraints(0)
    world.clear_faults()
    assert backend.set_limit(0, uuid=GPU0, milliwatts=300_000).ok
    assert backend.constraints(0).max_milliwatts == 400_000


def test_several_faults_on_one_op_error_wins_over_change_and_hangs_add_up() -> None:
    """Hangs run in turn, then the first error applies ahead of any change_to."""
    world, backend, _ = sim()
    world.add_fault(FaultSpec(op=FaultOp.UUID, gpu=0, change_to="GPU-x"))
    world.add_fault(FaultSpec(op=FaultOp.UUID, gpu=0, hang_seconds=0.05))
    world.add_fault(FaultSpec(op=FaultOp.UUID, gpu=0, hang_seconds=0.05))
    start = time.monotonic()
    assert backend.uuid(0) == "GPU-x"
    assert time.monotonic() - start >= 0.1
    world.add_fault(FaultSpec(op=FaultOp.UUID, gpu=0, error=GpuErrorClass.NOT_FOUND))
    with pytest.raises(GpuError) as caught:
        backend.uuid(0)
    assert caught.value.error_class is GpuErrorClass.NOT_FOUND


def test_closed_backend_and_view_fail_like_an_uninitialised_library() -> None:
    """After close() reads raise UNINITIALIZED and writes are not performed; close is idempotent."""
    world, backend, view = sim()
    backend.close()
    backend.close()
    with pytest.raises(GpuError) as caught:
        backend.device_count()
    assert caught.value.error_class is GpuErrorClass.UNINITIALIZED
    assert backend.set_limit(0, uuid=GPU0, milliwatts=200_000).error_class is (
        GpuErrorClass.UNINITIALIZED
    )
    assert world.limit_milliwatts(0) == 400_000
    view.close()
    view.close()
    with pytest.raises(PodViewError):
        view.snapshot()


def _run(world: SimWorld) -> list[object]:
    """A fixed call sequence over ten cycles of the built-in scenario, every answer recorded."""
    backend, view = SimGpuBackend(world), SimPodView(world)
    answers: list[object] = []
    for cycle in range(1, 11):
        world.begin_cycle(cycle)
        snap = view.snapshot()
        answers.append((sorted(snap.pods), snap.resource_version))
        for index in range(backend.device_count()):
            uuid = backend.uuid(index)
            procs = backend.processes(index)
            answers.append(procs)
            if procs:
                answers.append(backend.set_limit(index, uuid=uuid, milliwatts=450_000))
            else:
                answers.append(backend.restore_default(index, uuid=uuid))
    answers.append(world.writes())
    return answers


def test_same_scenario_and_calls_give_the_same_results() -> None:
    """Determinism: two worlds driven by the same calls answer and log identically."""
    first, second = _run(SimWorld(builtin_scenario())), _run(SimWorld(builtin_scenario()))
    with pytest.raises(ValueError, match=">= 0"):
        SimWorld(builtin_scenario()).begin_cycle(-1)  # cycle numbers are never negative
    assert first == second
    writes = first[-1]
    assert isinstance(writes, tuple)
    failed = [(w.cycle, w.index) for w in writes if w.outcome is not WriteOutcome.OK]
    assert failed == [(4, 0), (5, 0), (6, 0)], "the built-in fault hits GPU 0 in cycles 4-6"


def test_world_is_safe_to_use_from_several_threads() -> None:
    """Concurrent writes from many threads are all logged and the last limit is one of them."""
    world, backend, _ = sim()
    values = [100_000 + 1000 * i for i in range(8)]

    def hammer(mw: int) -> None:
        for _ in range(50):
            assert backend.set_limit(0, uuid=GPU0, milliwatts=mw).ok

    threads = [threading.Thread(target=hammer, args=(mw,)) for mw in values]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(world.writes()) == 400
    assert world.limit_milliwatts(0) in values


def test_builtin_scenario_tells_its_story_through_the_real_reconciler(tmp_path: Path) -> None:
    """The demo's promises hold end to end: fault in cycles 4-6 only; GPU 5 capped at 250 W
    through its claim (source claim, the claim named) from cycle 3, before its process
    starts in cycle 5; released in cycle 9."""
    s = builtin_scenario()
    world = SimWorld(s)
    world.materialise_procs(tmp_path / "proc")
    clock = FakeClock()
    backend = SimGpuBackend(world)
    reconciler = Reconciler(
        backend=backend,
        pods=SimPodView(world),
        attributor=Attributor(FsProcRoot(tmp_path / "proc")),
        store=OwnershipStore(tmp_path / "state", clock=clock),
        clock=clock,
        policy=Policy(
            annotation_key=DEFAULT_ANNOTATION_KEY, safe_default_watts=s.safe_default_watts
        ),
        initial_device_count=backend.device_count(),
        listeners=[world],
        claims=SimClaimView(world, node=s.node_name),
    )
    reports = [reconciler.reconcile_once() for _ in range(10)]
    assert [r.enforced for r in reports] == [True] * 3 + [False] * 3 + [True] * 4
    first = reports[0].gpus
    assert [g.applied_watts for g in first] == [450, 350, 300, 700, None, None]
    assert first[4].outcome is Outcome.IDLE
    gpu5 = [r.gpus[5] for r in reports]
    assert [g.outcome for g in gpu5] == [Outcome.IDLE] * 2 + [Outcome.ENFORCED] * 6 + [
        Outcome.RELEASED,
        Outcome.IDLE,
    ]
    for capped in gpu5[2:8]:
        assert (capped.applied_watts, capped.cap_source) == (250, CapSource.CLAIM)
        assert [str(c) for c in capped.claims] == ["batch/nightly-etl-gpu"]
    assert [g.process_count for g in gpu5[2:8]] == [0, 0, 1, 1, 1, 1], "capped before it runs"
    assert world.limit_milliwatts(5) == 700_000
    assert world.limit_milliwatts(0) == 450_000
