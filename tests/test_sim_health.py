"""Device faults through the real Reconciler on the simulated node: which ones make a GPU
unhealthy, which leave it healthy, and how each recovers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from capwatch.agent.attribution import Attributor
from capwatch.agent.capping import DEFAULT_ANNOTATION_KEY
from capwatch.agent.devices import fold, inventory
from capwatch.agent.gpus import GpuErrorClass
from capwatch.agent.health.faults import DEFAULT_FAULT_RECOVERY_S, DEFAULT_XID_IGNORE, FaultKind
from capwatch.agent.health.telemetry import DeviceEventKind, ThrottleReason
from capwatch.agent.ownership import OwnershipStore
from capwatch.agent.reconciling import Reconciler
from capwatch.agent.reports import CycleReport, GpuResult, Outcome, Reason
from capwatch.agent.sim.devices import READS
from capwatch.agent.sim.scenario import Scenario, default_scenario, parse_scenario
from capwatch.agent.sim.views import SimGpuBackend, SimPodView
from capwatch.agent.sim.world import SimWorld
from capwatch.agent.stepping import Policy
from capwatch.kit.clock import FakeClock

UID_A = "11111111-2222-4333-8444-555555555555"
GPU0, GPU1 = "GPU-aaaa-0", "GPU-aaaa-1"


def scenario(*device_faults: dict[str, Any]) -> Scenario:
    """GPU 0 runs pod A (capped at 250 W); GPU 1 is idle."""
    return parse_scenario(
        {
            "node_name": "n",
            "safe_default_watts": 300,
            "gpus": [
                {"uuid": GPU0, "min_watts": 100, "max_watts": 400, "default_watts": 400},
                {"uuid": GPU1, "min_watts": 100, "max_watts": 400, "default_watts": 400},
            ],
            "pods": [
                {"namespace": "ns", "name": "a", "uid": UID_A, "annotations": {"k": "250"}},
            ],
            "processes": [{"gpu": 0, "pid": 10, "pod": UID_A}],
            "device_faults": list(device_faults),
        },
        source="test",
    )


class Node:
    """A simulated node under the real Reconciler, on a clock the test moves."""

    def __init__(self, tmp_path: Path, s: Scenario) -> None:
        self.world = SimWorld(s)
        self.clock = FakeClock()
        backend = SimGpuBackend(self.world)
        self.reconciler = Reconciler(
            backend=backend,
            pods=SimPodView(self.world),
            attributor=Attributor(self.world),
            store=OwnershipStore(tmp_path / "state", clock=self.clock),
            clock=self.clock,
            policy=Policy(annotation_key="k", safe_default_watts=s.safe_default_watts),
            initial_device_count=backend.device_count(),
            listeners=[self.world],
        )

    def cycle(self, *, after_s: float = 1.0) -> CycleReport:
        self.clock.advance(after_s)
        return self.reconciler.reconcile_once()

    def gpu(self, index: int, *, after_s: float = 1.0) -> GpuResult:
        """GPU ``index``'s step in the next cycle (its first result: a lost GPU capped
        earlier also gets a deferred release after it)."""
        return next(g for g in self.cycle(after_s=after_s).gpus if g.index == index)


def kinds(result: GpuResult) -> list[tuple[FaultKind, int]]:
    return [(f.kind, f.code) for f in result.faults]


FAULTS = [
    # (id, device fault on GPU g in cycles 2-3, the fault it raises)
    ("xid", {"kind": "xid", "code": 79}, (FaultKind.XID, 79)),
    ("ecc", {"kind": "ecc", "count": 2}, (FaultKind.ECC_UNCORRECTED, 0)),
    ("lost", {"kind": "lost"}, (FaultKind.GPU_LOST, 0)),
    ("row remap", {"kind": "row_remap_failure"}, (FaultKind.ROW_REMAP_FAILURE, 0)),
]


@pytest.mark.parametrize("gpu", [0, 1], ids=["capped", "idle"])
@pytest.mark.parametrize(("fault", "raised"), [pytest.param(f, r, id=i) for i, f, r in FAULTS])
def test_each_fault_kind_makes_the_gpu_unhealthy_while_it_lasts(
    tmp_path: Path, gpu: int, fault: dict[str, Any], raised: tuple[FaultKind, int]
) -> None:
    """In cycles 2-3 the GPU carries the fault and reads unhealthy; cycle 1 was healthy;
    the other GPU stays healthy throughout."""
    node = Node(tmp_path, scenario({**fault, "gpu": gpu, "cycles": {"from": 2, "to": 3}}))
    first = node.cycle()
    assert all(g.healthy and not g.faults for g in first.gpus)
    for _ in (2, 3):
        report = node.cycle()
        result = next(g for g in report.gpus if g.index == gpu)
        assert kinds(result) == [raised]
        assert not result.healthy
        assert all(g.healthy for g in report.gpus if g.index != gpu)


@pytest.mark.parametrize("fault", [f for _, f, _ in FAULTS[2:]], ids=["lost", "row remap"])
def test_state_driven_faults_clear_as_soon_as_the_state_does(
    tmp_path: Path, fault: dict[str, Any]
) -> None:
    """A lost GPU and a failed row remap clear in the first cycle after their range, with
    no quiet window: the capped GPU is enforced and healthy again, same UUID, same cap."""
    node = Node(tmp_path, scenario({**fault, "gpu": 0, "cycles": 2}))
    node.cycle()
    assert not node.gpu(0).healthy
    back = node.gpu(0)
    assert (back.healthy, back.faults, back.uuid) == (True, (), GPU0)
    assert (back.outcome, back.applied_watts) == (Outcome.ENFORCED, 250)


def test_a_lost_gpu_fails_its_step_and_the_cycle_and_refuses_the_write(tmp_path: Path) -> None:
    """Lost: the step fails reading the UUID (gpu_is_lost), so the cycle is not enforced,
    and nothing is written to it; the capped GPU's release waits for it."""
    node = Node(tmp_path, scenario({"kind": "lost", "gpu": 0, "cycles": 2}))
    assert node.cycle().enforced
    writes = len(node.world.writes())
    report = node.cycle()
    assert not report.enforced
    step, deferred = (g for g in report.gpus if g.index == 0)
    assert (step.reason, step.error_class, step.readings) == (
        Reason.UUID_READ_FAILED,
        GpuErrorClass.GPU_IS_LOST,
        None,
    )
    assert (deferred.reason, deferred.uuid) == (Reason.RELEASE_DEFERRED, GPU0)
    assert len(node.world.writes()) == writes
    assert node.cycle().enforced


def test_a_gpu_lost_before_the_agent_ever_saw_it_fails_but_names_no_fault(
    tmp_path: Path,
) -> None:
    """Lost from cycle 1: its step fails (unhealthy) but no UUID is known to hang a
    gpu_lost fault on; once it answers, it is healthy."""
    node = Node(tmp_path, scenario({"kind": "lost", "gpu": 1, "cycles": 1}))
    lost = node.gpu(1)
    assert (lost.healthy, lost.faults, lost.reason) == (False, (), Reason.UUID_READ_FAILED)
    assert node.gpu(1).healthy


@pytest.mark.parametrize("kind", ["xid", "ecc"])
def test_event_driven_faults_clear_after_the_quiet_window(tmp_path: Path, kind: str) -> None:
    """An XID or ECC burst in cycle 2 keeps its fault until the recovery window (10
    minutes) has passed without another, then the GPU reads healthy."""
    fault = {"kind": kind, "gpu": 1, "cycles": 2, **({"code": 79} if kind == "xid" else {})}
    node = Node(tmp_path, scenario(fault))
    node.cycle()
    assert not node.gpu(1).healthy  # cycle 2: the fault is seen at t
    # 599 s after it, still; 600 s after it, the window has passed.
    assert not node.gpu(1, after_s=DEFAULT_FAULT_RECOVERY_S - 1).healthy
    assert node.gpu(1, after_s=1.0).healthy


def test_a_repeating_xid_keeps_its_fault_past_the_window(tmp_path: Path) -> None:
    """An XID every cycle (no range end) outlasts the window; its count grows."""
    node = Node(tmp_path, scenario({"kind": "xid", "gpu": 0, "code": 48, "cycles": {"from": 1}}))
    counts = [node.gpu(0, after_s=DEFAULT_FAULT_RECOVERY_S).faults[0].count for _ in range(3)]
    assert counts == [1, 2, 3]


@pytest.mark.parametrize("code", sorted(DEFAULT_XID_IGNORE))
def test_application_xids_are_drained_but_leave_the_gpu_healthy(tmp_path: Path, code: int) -> None:
    """The XIDs a program causes (13, 31, 43, 45, 68, 109) are in the cycle's events
    but raise no fault."""
    node = Node(tmp_path, scenario({"kind": "xid", "gpu": 0, "code": code, "count": 50}))
    report = node.cycle()
    assert [(e.kind, e.code, e.count) for e in report.events] == [(DeviceEventKind.XID, code, 50)]
    assert all(g.healthy and not g.faults for g in report.gpus)


@pytest.mark.parametrize(
    "fault",
    [
        {"kind": "unsupported", "reads": list(READS)},
        {"kind": "failing", "reads": list(READS)},
        {"kind": "throttle", "reasons": ["hw_thermal_slowdown", "hw_power_brake_slowdown"]},
        {"kind": "row_remap_pending"},
        {"kind": "older_part"},
    ],
    ids=lambda f: f["kind"],
)
@pytest.mark.parametrize("gpu", [0, 1], ids=["capped", "idle"])
def test_readings_that_are_not_faults_leave_the_gpu_healthy(
    tmp_path: Path, gpu: int, fault: dict[str, Any]
) -> None:
    """Reads the device does not support, reads that fail, throttling, a pending remap and
    an older part are readings, never faults: the GPU stays healthy and enforced."""
    node = Node(tmp_path, scenario({**fault, "gpu": gpu}))
    for _ in range(3):
        result = node.gpu(gpu)
        assert (result.healthy, result.faults) == (True, ())
        assert result.readings is not None
    if fault["kind"] == "unsupported":
        assert result.readings.power_draw_milliwatts is None
        assert result.readings.failed_reads == ()
    if fault["kind"] == "failing":
        assert result.readings.failed_reads == READS
    if fault["kind"] == "throttle":
        assert ThrottleReason.HW_THERMAL_SLOWDOWN in (result.readings.throttle_reasons or ())


def test_an_older_part_cannot_report_a_row_remap_failure(tmp_path: Path) -> None:
    """On a part that retires pages, a row remap failure is not readable: no fault."""
    node = Node(
        tmp_path,
        scenario({"kind": "older_part", "gpu": 0}, {"kind": "row_remap_failure", "gpu": 0}),
    )
    result = node.gpu(0)
    assert result.healthy
    assert result.readings is not None
    assert result.readings.row_remap_failure is None


def test_the_readings_show_the_cap_holding_a_busy_gpu_back(tmp_path: Path) -> None:
    """Through the loop: the capped GPU reads 250 W drawn of a 250 W limit, with
    sw_power_cap; the idle one a tenth of its default, with gpu_idle."""
    node = Node(tmp_path, scenario())
    capped, idle = node.cycle().gpus
    assert capped.readings is not None
    assert idle.readings is not None
    assert (capped.readings.power_draw_milliwatts, capped.readings.enforced_limit_milliwatts) == (
        250_000,
        250_000,
    )
    assert capped.readings.throttle_reasons == (ThrottleReason.SW_POWER_CAP,)
    assert idle.readings.power_draw_milliwatts == 40_000
    assert idle.readings.throttle_reasons == (ThrottleReason.GPU_IDLE,)


def test_the_builtin_scenario_loses_gpu_4_in_cycles_12_to_14_and_gets_it_back(
    tmp_path: Path,
) -> None:
    """The demo's lost GPU: cycles 12-14 fail on GPU 4 alone (gpu_is_lost, a gpu_lost
    fault), cycle 15 is enforced with GPU 4 healthy under the same UUID."""
    s = default_scenario()
    world = SimWorld(s)
    clock = FakeClock()
    backend = SimGpuBackend(world)
    reconciler = Reconciler(
        backend=backend,
        pods=SimPodView(world),
        attributor=Attributor(world),
        store=OwnershipStore(tmp_path / "state", clock=clock),
        clock=clock,
        policy=Policy(
            annotation_key=DEFAULT_ANNOTATION_KEY, safe_default_watts=s.safe_default_watts
        ),
        initial_device_count=backend.device_count(),
        listeners=[world],
    )
    reports = [reconciler.reconcile_once() for _ in range(16)]
    assert [r.enforced for r in reports] == [True] * 3 + [False] * 3 + [True] * 5 + [False] * 3 + [
        True
    ] * 2
    assert {r.failure_summary for r in reports[11:14]} == {"gpu4:uuid_read_failed"}
    for report in reports[11:14]:
        gpu4 = report.gpus[4]
        assert gpu4.error_class is GpuErrorClass.GPU_IS_LOST
        assert kinds(gpu4) == [(FaultKind.GPU_LOST, 0)]
    back = reports[14].gpus[4]
    assert (back.outcome, back.uuid, back.healthy) == (Outcome.IDLE, s.gpus[4].uuid, True)
    assert all(g.healthy for r in reports[14:] for g in r.gpus)


def test_a_lost_capped_gpu_keeps_its_fault_in_the_device_table(tmp_path: Path) -> None:
    """A capped GPU that is lost gets two results in a cycle (its failed step, then the
    deferred release of its cap); both carry gpu_lost, so the device table, which keeps
    the last, still shows the fault, and it clears when the GPU answers again."""
    node = Node(tmp_path, scenario({"kind": "lost", "gpu": 0, "cycles": {"from": 2, "to": 3}}))
    table = inventory({0: None, 1: None}, wall=0.0)
    table = fold(table, node.cycle())
    report = node.cycle()
    results = [g for g in report.gpus if g.index == 0]
    assert [g.reason for g in results] == [Reason.UUID_READ_FAILED, Reason.RELEASE_DEFERRED]
    assert all(kinds(g) == [(FaultKind.GPU_LOST, 0)] for g in results)
    table = fold(table, report)
    assert table[0].result is not None
    assert kinds(table[0].result) == [(FaultKind.GPU_LOST, 0)]
    node.cycle()
    table = fold(table, node.cycle())
    assert table[0].result is not None
    assert table[0].result.healthy
