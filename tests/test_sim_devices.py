"""The simulated devices under a scenario's device faults: what each cycle reads and
fires, the power model, and a lost GPU through the backend."""

from __future__ import annotations

from typing import Any

import pytest

from capwatch.agent.gpus import GpuError, GpuErrorClass, WriteOutcome
from capwatch.agent.health.telemetry import (
    EVENT_KEYS_LIMIT,
    DeviceEventKind,
    Readings,
    ThrottleReason,
)
from capwatch.agent.sim.devices import READS
from capwatch.agent.sim.scenario import Scenario, parse_scenario
from capwatch.agent.sim.views import SimGpuBackend
from capwatch.agent.sim.world import SimWorld

UID_A = "11111111-2222-4333-8444-555555555555"
GPU0, GPU1 = "GPU-aaaa-0", "GPU-aaaa-1"
T = ThrottleReason


def scenario(*device_faults: dict[str, Any]) -> Scenario:
    """GPU 0 (100-400 W, default 300 W) runs pod A's process; GPU 1 (same range) is idle."""
    return parse_scenario(
        {
            "node_name": "n",
            "safe_default_watts": 300,
            "gpus": [
                {"uuid": GPU0, "min_watts": 100, "max_watts": 400, "default_watts": 300},
                {"uuid": GPU1, "min_watts": 100, "max_watts": 400, "default_watts": 300},
            ],
            "pods": [{"namespace": "ns", "name": "a", "uid": UID_A}],
            "processes": [{"gpu": 0, "pid": 10, "pod": UID_A}],
            "device_faults": list(device_faults),
        },
        source="test",
    )


def sim(*device_faults: dict[str, Any]) -> tuple[SimWorld, SimGpuBackend]:
    world = SimWorld(scenario(*device_faults))
    return world, SimGpuBackend(world)


def events(backend: SimGpuBackend) -> list[tuple[DeviceEventKind, int, str | None, int, int]]:
    """The drained events without their times: (kind, index, uuid, code, count)."""
    return [(e.kind, e.index, e.uuid, e.code, e.count) for e in backend.drain_events()]


def over(world: SimWorld, read: Any, cycles: range) -> list[Any]:
    """``read()`` after each of ``cycles`` begins."""
    out = []
    for cycle in cycles:
        world.begin_cycle(cycle)
        out.append(read())
    return out


# --- the power model ---------------------------------------------------------------------


def test_an_idle_gpu_draws_a_tenth_of_its_default_and_reads_gpu_idle() -> None:
    """Idle (no processes): a tenth of the default limit, ``gpu_idle``, the limit read back."""
    _, backend = sim()
    r = backend.readings(1)
    assert r.power_draw_milliwatts == 30_000
    assert r.enforced_limit_milliwatts == 300_000
    assert r.throttle_reasons == (T.GPU_IDLE,)
    assert (r.ecc_uncorrected_volatile, r.row_remap_pending, r.row_remap_failure) == (
        0,
        False,
        False,
    )
    assert (r.failed_reads, r.lost, r.retired_pages_pending) == ((), False, None)


def test_a_busy_gpu_draws_up_to_its_cap_and_reads_sw_power_cap_while_held_back() -> None:
    """Busy: it wants 90 % of its maximum (360 W); a 250 W cap holds it at 250 W with
    ``sw_power_cap``; at 400 W it draws what it wants, without."""
    world, backend = sim()
    assert backend.set_limit(0, uuid=GPU0, milliwatts=250_000).ok
    capped = backend.readings(0)
    assert (capped.power_draw_milliwatts, capped.enforced_limit_milliwatts) == (250_000, 250_000)
    assert capped.throttle_reasons == (T.SW_POWER_CAP,)
    assert backend.set_limit(0, uuid=GPU0, milliwatts=400_000).ok
    free = backend.readings(0)
    assert (free.power_draw_milliwatts, free.throttle_reasons) == (360_000, ())
    assert world.limit_milliwatts(0) == 400_000


# --- state held over a cycle range -----------------------------------------------------


def test_a_lost_range_loses_the_gpu_during_it_and_returns_it_after() -> None:
    """``lost`` in cycles 2-3: lost exactly then, the same UUID before and after."""
    world, backend = sim({"kind": "lost", "gpu": 1, "cycles": {"from": 2, "to": 3}})
    assert over(world, lambda: world.devices.is_lost(1), range(1, 6)) == [
        False,
        True,
        True,
        False,
        False,
    ]
    assert not world.devices.is_lost(0)
    assert backend.uuid(1) == GPU1


def test_a_lost_gpu_answers_gpu_is_lost_to_every_call_and_refuses_writes() -> None:
    """While lost: the UUID, process and constraint reads raise GPU_IS_LOST, the reads say
    lost, writes are IDENTITY_UNCONFIRMED with class gpu_is_lost (logged, limit kept);
    the device count still counts it. Once back, the same UUID, and writes take."""
    world, backend = sim({"kind": "lost", "gpu": 0, "cycles": 2})
    world.begin_cycle(2)
    for call in (backend.uuid, backend.processes, backend.constraints):
        with pytest.raises(GpuError) as caught:
            call(0)
        assert caught.value.error_class is GpuErrorClass.GPU_IS_LOST
    assert backend.readings(0) == Readings(lost=True)
    for write in (
        lambda: backend.set_limit(0, uuid=GPU0, milliwatts=200_000),
        lambda: backend.restore_default(0, uuid=GPU0),
    ):
        result = write()
        assert (result.outcome, result.error_class) == (
            WriteOutcome.IDENTITY_UNCONFIRMED,
            GpuErrorClass.GPU_IS_LOST,
        )
    assert world.limit_milliwatts(0) == 300_000
    assert [w.outcome for w in world.writes()] == [WriteOutcome.IDENTITY_UNCONFIRMED] * 2
    assert backend.device_count() == 2
    assert backend.uuid(1) == GPU1  # the other GPU is unaffected
    world.begin_cycle(3)
    assert backend.uuid(0) == GPU0
    assert backend.set_limit(0, uuid=GPU0, milliwatts=200_000).ok
    assert not backend.readings(0).lost


@pytest.mark.parametrize(
    ("fault", "field", "during", "outside"),
    [
        ({"kind": "row_remap_failure"}, "row_remap_failure", True, False),
        ({"kind": "row_remap_pending"}, "row_remap_pending", True, False),
        (
            {"kind": "throttle", "reasons": ["hw_thermal_slowdown"]},
            "throttle_reasons",
            (T.GPU_IDLE, T.HW_THERMAL_SLOWDOWN),
            (T.GPU_IDLE,),
        ),
        ({"kind": "unsupported", "reads": ["ecc"]}, "ecc_uncorrected_volatile", None, 0),
        ({"kind": "failing", "reads": ["power_draw"]}, "failed_reads", ("power_draw",), ()),
        ({"kind": "older_part"}, "row_remap_failure", None, False),
        ({"kind": "older_part"}, "retired_pages_pending", False, None),
    ],
    ids=lambda v: v["kind"] if isinstance(v, dict) else None,
)
def test_each_state_holds_in_its_range_only(
    fault: dict[str, Any], field: str, during: object, outside: object
) -> None:
    """Each state-holding kind changes its reading in cycles 2-3 and nowhere else."""
    world, backend = sim({**fault, "gpu": 1, "cycles": {"from": 2, "to": 3}})
    seen = over(world, lambda: getattr(backend.readings(1), field), range(1, 5))
    assert seen == [outside, during, during, outside]


def test_unsupported_and_failing_reads_are_absent_and_only_failing_ones_are_named() -> None:
    """Every read unsupported: all None, nothing named; every read failing: all None, each
    named; the lost flag stays False (not a lost GPU)."""
    world, backend = sim(
        {"kind": "unsupported", "gpu": 0, "reads": list(READS)},
        {"kind": "failing", "gpu": 1, "reads": list(READS)},
    )
    world.begin_cycle(1)
    for index, named in ((0, ()), (1, READS)):
        assert backend.readings(index) == Readings(failed_reads=named)


def test_states_without_cycles_hold_from_start_up() -> None:
    """A state fault without ``cycles`` holds at cycle 0, before any cycle begins."""
    world, backend = sim({"kind": "row_remap_failure", "gpu": 0})
    assert backend.readings(0).row_remap_failure is True
    world.begin_cycle(1)
    assert backend.readings(0).row_remap_failure is True


def test_overlapping_throttles_add_up_and_each_ends_on_its_own() -> None:
    """Two throttle faults on one GPU: their union while both hold, one's reasons after."""
    world, backend = sim(
        {"kind": "throttle", "gpu": 1, "reasons": ["hw_slowdown"], "cycles": {"from": 1, "to": 2}},
        {"kind": "throttle", "gpu": 1, "reasons": ["sync_boost"], "cycles": {"from": 2, "to": 3}},
    )
    seen = over(world, lambda: backend.readings(1).throttle_reasons, range(1, 5))
    assert seen == [
        (T.GPU_IDLE, T.HW_SLOWDOWN),
        (T.GPU_IDLE, T.HW_SLOWDOWN, T.SYNC_BOOST),
        (T.GPU_IDLE, T.SYNC_BOOST),
        (T.GPU_IDLE,),
    ]


def test_runtime_changes_stay_until_a_scenario_fault_on_that_state_starts_or_ends() -> None:
    """``world.devices`` changes survive cycles the scenario changes nothing in; the
    scenario's own edges still apply (a lost range ends: the GPU recovers)."""
    world, backend = sim({"kind": "lost", "gpu": 1, "cycles": {"from": 3, "to": 3}})
    world.devices.set_throttle(1, [T.HW_POWER_BRAKE_SLOWDOWN])
    world.devices.lose(0)
    world.begin_cycle(1)
    world.begin_cycle(2)
    assert backend.readings(1).throttle_reasons == (T.GPU_IDLE, T.HW_POWER_BRAKE_SLOWDOWN)
    assert world.devices.is_lost(0)
    world.devices.recover(0)
    world.begin_cycle(3)
    assert world.devices.is_lost(1)
    world.devices.recover(1)  # a test may end a scenario's loss early
    assert not world.devices.is_lost(1)
    world.begin_cycle(4)
    assert not world.devices.is_lost(1)


def test_cycles_may_be_skipped_and_revisited() -> None:
    """The held state is the cycle's, whatever cycle came before (1, then 5, then 2)."""
    world, _ = sim({"kind": "lost", "gpu": 0, "cycles": {"from": 2, "to": 3}})
    world.begin_cycle(1)
    assert not world.devices.is_lost(0)
    world.begin_cycle(5)
    assert not world.devices.is_lost(0)
    world.begin_cycle(2)
    assert world.devices.is_lost(0)


# --- events --------------------------------------------------------------------------------


def test_an_xid_fires_its_count_in_every_cycle_of_its_range_with_the_gpus_uuid() -> None:
    """``xid`` over cycles 2-3 with count 5: five XID events as each of those cycles
    begins, bound to the GPU's UUID; none before, after, or at start-up."""
    world, backend = sim(
        {"kind": "xid", "gpu": 1, "code": 79, "count": 5, "cycles": {"from": 2, "to": 3}}
    )
    assert events(backend) == []
    fired = over(world, lambda: events(backend), range(1, 5))
    xid = (DeviceEventKind.XID, 1, GPU1, 79, 5)
    assert fired == [[], [xid], [xid], []]


def test_an_xid_without_cycles_fires_every_cycle_but_not_at_start_up() -> None:
    """Without ``cycles`` an XID fires as each cycle begins; begun twice before a drain,
    its events add up into one entry."""
    world, backend = sim({"kind": "xid", "gpu": 0, "code": 48})
    assert events(backend) == []
    world.begin_cycle(1)
    world.begin_cycle(2)
    assert events(backend) == [(DeviceEventKind.XID, 0, GPU0, 48, 2)]


def test_ecc_errors_raise_the_volatile_count_and_fire_events_each_cycle() -> None:
    """``ecc`` count 2 in cycles 2-3: the count reads 0, 2, 4, 4 and each cycle drains a
    double-bit event of count 2; a lost range after it resets the count (a reset)."""
    world, backend = sim(
        {"kind": "ecc", "gpu": 0, "count": 2, "cycles": {"from": 2, "to": 3}},
        {"kind": "lost", "gpu": 0, "cycles": 5},
    )
    seen = over(
        world, lambda: (backend.readings(0).ecc_uncorrected_volatile, events(backend)), range(1, 5)
    )
    ecc = (DeviceEventKind.ECC_DOUBLE_BIT, 0, GPU0, 0, 2)
    assert seen == [(0, []), (2, [ecc]), (4, [ecc]), (4, [])]
    world.begin_cycle(5)
    world.begin_cycle(6)
    assert backend.readings(0).ecc_uncorrected_volatile == 0


def test_the_same_scenario_and_cycles_give_the_same_reads_and_events() -> None:
    """Deterministic: two worlds of one scenario, driven alike, read and fire alike."""
    faults = (
        {"kind": "xid", "gpu": 0, "code": 79, "cycles": {"from": 2, "to": 4}},
        {"kind": "ecc", "gpu": 1, "count": 3, "cycles": 3},
        {"kind": "lost", "gpu": 1, "cycles": 4},
        {"kind": "throttle", "gpu": 0, "reasons": ["hw_slowdown"], "cycles": {"from": 3}},
    )

    def run() -> list[object]:
        world, backend = sim(*faults)
        return over(
            world, lambda: (events(backend), backend.readings(0), backend.readings(1)), range(1, 6)
        )

    first = run()
    assert first == run()
    assert first[3][2] == Readings(lost=True)


def test_events_past_the_accumulators_bound_are_dropped_and_counted():
    """More distinct XID numbers between two drains than the accumulator keeps: the rest
    are dropped, and the backend's running total of drops (the metric
    capwatch_gpu_events_dropped_total) counts every one, drain after drain."""
    world, backend = sim()
    for code in range(EVENT_KEYS_LIMIT + 5):
        world.devices.queue_xid(0, code, uuid=GPU0)
    assert len(backend.drain_events()) == EVENT_KEYS_LIMIT
    assert backend.events_dropped_total() == 5
    for code in range(EVENT_KEYS_LIMIT + 2):
        world.devices.queue_xid(0, code, uuid=GPU0, count=2)
    backend.drain_events()
    assert backend.events_dropped_total() == 5 + 2 * 2
