"""The device-health model (agent/health/faults.py): which evidence raises which fault."""

from __future__ import annotations

import pytest

from capwatch.agent.gpus import GpuErrorClass
from capwatch.agent.health.faults import (
    DEFAULT_XID_IGNORE,
    FAULTS_PER_GPU_LIMIT,
    FaultKind,
    FaultTracker,
    XidPolicy,
    parse_xids,
)
from capwatch.agent.health.telemetry import NO_READINGS, DeviceEvent, DeviceEventKind, Readings
from capwatch.kit.errors import ConfigError

UUID = "GPU-aaaa"
OTHER = "GPU-bbbb"
RECOVERY = 600.0


class Clock:
    def __init__(self) -> None:
        self.mono = 100.0
        self.wall_s = 1_750_000_000.0

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall_s += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


def tracker(clock: Clock, policy: XidPolicy | None = None) -> FaultTracker:
    return FaultTracker(
        policy=policy, recovery_s=RECOVERY, wall=lambda: clock.wall_s, monotonic=lambda: clock.mono
    )


def xid(code: int, *, count: int = 1, uuid: str | None = UUID, index: int = 0) -> DeviceEvent:
    return DeviceEvent(
        kind=DeviceEventKind.XID,
        index=index,
        uuid=uuid,
        code=code,
        count=count,
        first_wall=1.0,
        last_wall=2.0,
    )


def observe(
    t: FaultTracker,
    *,
    uuid: str | None = UUID,
    readings: Readings = NO_READINGS,
    error=None,
    uuid_failed=False,
    index: int = 0,
):
    return t.observe(
        index, uuid=uuid, readings=readings, error_class=error, uuid_failed=uuid_failed
    )


def kinds(faults) -> list[tuple[str, int]]:
    return [(f.kind.value, f.code) for f in faults]


def test_a_fatal_xid_is_a_fault_with_its_code_and_count(clock: Clock):
    """XID 79 (fallen off the bus) raises an xid fault carrying its number and event count."""
    t = tracker(clock)
    t.take_events([xid(79, count=3)])
    (fault,) = observe(t)
    assert (fault.kind, fault.code, fault.count) == (FaultKind.XID, 79, 3)
    assert fault.summary == "XID 79"


@pytest.mark.parametrize("code", sorted(DEFAULT_XID_IGNORE))
def test_application_xids_are_ignored_by_default(clock: Clock, code: int):
    """The XIDs the NVIDIA device plugin ignores (a program's own errors) leave the GPU healthy."""
    t = tracker(clock)
    t.take_events([xid(code)])
    assert observe(t) == ()


def test_fatal_list_wins_over_ignore_and_ignore_all_keeps_only_fatal(clock: Clock):
    """--xid-fatal makes an ignored XID a fault; --xid-ignore all ignores all the others."""
    t = tracker(clock, XidPolicy(ignore_all=True, fatal=frozenset({13})))
    t.take_events([xid(13), xid(79), xid(48)])
    assert kinds(observe(t)) == [("xid", 13)]


def test_an_xid_clears_after_the_quiet_window_and_a_new_one_restarts_it(clock: Clock):
    """Event-driven faults have nothing to re-read: they clear when no new event came for
    the recovery window, measured on the monotonic clock from the last event."""
    t = tracker(clock)
    t.take_events([xid(79)])
    assert kinds(observe(t)) == [("xid", 79)]
    clock.advance(RECOVERY - 1)
    t.take_events([xid(79)])
    assert observe(t)[0].count == 2
    clock.advance(RECOVERY - 1)
    assert kinds(observe(t)) == [("xid", 79)]
    clock.advance(1)
    assert observe(t) == ()


def test_a_lost_gpu_stays_faulted_until_the_same_uuid_answers(clock: Clock):
    """GPU_IS_LOST (or the UUID read failing) raises gpu_lost on the last UUID seen at the
    index, whatever time passes; it clears when that UUID answers again."""
    t = tracker(clock)
    assert observe(t) == ()
    lost = observe(t, uuid=None, error=GpuErrorClass.GPU_IS_LOST, uuid_failed=True)
    assert kinds(lost) == [("gpu_lost", 0)]
    clock.advance(RECOVERY * 10)
    again = observe(t, uuid=None, error=GpuErrorClass.NOT_FOUND, uuid_failed=True)
    assert (kinds(again), again[0].count) == ([("gpu_lost", 0)], 2)
    assert observe(t) == ()


def test_a_lost_read_during_an_otherwise_good_step_is_a_lost_gpu(clock: Clock):
    """Readings that say "GPU is lost" raise the fault even when the step itself passed."""
    t = tracker(clock)
    assert kinds(observe(t, readings=Readings(lost=True))) == [("gpu_lost", 0)]


def test_a_refused_uuid_read_is_not_a_lost_gpu(clock: Clock):
    """A UUID read refused for a reason that does not mean the device is gone is not lost."""
    t = tracker(clock)
    observe(t)
    assert observe(t, uuid=None, error=GpuErrorClass.NO_PERMISSION, uuid_failed=True) == ()


def test_another_device_at_the_index_does_not_inherit_or_clear_the_fault(clock: Clock):
    """Faults follow the UUID: a different GPU at the index starts clean, and the lost one
    stays lost until it answers."""
    t = tracker(clock)
    observe(t)
    observe(t, uuid=None, error=GpuErrorClass.GPU_IS_LOST, uuid_failed=True)
    assert observe(t, uuid=OTHER) == ()
    assert kinds(observe(t, uuid=UUID, index=1)) == []  # answered: cleared


def test_ecc_counts_rising_is_a_fault_a_constant_or_first_count_is_not(clock: Clock):
    """The first volatile count read is a baseline; an increase raises ecc_uncorrected with
    the number of new errors; a reset (count back to 0) is a new baseline."""
    t = tracker(clock)
    assert observe(t, readings=Readings(ecc_uncorrected_volatile=5)) == ()
    assert observe(t, readings=Readings(ecc_uncorrected_volatile=5)) == ()
    (fault,) = observe(t, readings=Readings(ecc_uncorrected_volatile=8))
    assert (fault.kind, fault.count) == (FaultKind.ECC_UNCORRECTED, 3)
    observe(t, readings=Readings(ecc_uncorrected_volatile=0))
    clock.advance(RECOVERY)
    assert observe(t, readings=Readings(ecc_uncorrected_volatile=0)) == ()


def test_a_double_bit_event_is_an_ecc_fault(clock: Clock):
    """A double-bit ECC event raises ecc_uncorrected without waiting for the counter."""
    t = tracker(clock)
    t.take_events(
        [
            DeviceEvent(
                kind=DeviceEventKind.ECC_DOUBLE_BIT,
                index=0,
                uuid=UUID,
                code=0,
                count=1,
                first_wall=1,
                last_wall=1,
            )
        ]
    )
    assert kinds(observe(t)) == [("ecc_uncorrected", 0)]


def test_row_remap_failure_follows_the_device_state(clock: Clock):
    """A remap failure is active while the read says so and clears when it says not;
    an unavailable read changes nothing."""
    t = tracker(clock)
    assert kinds(observe(t, readings=Readings(row_remap_failure=True))) == [
        ("row_remap_failure", 0)
    ]
    assert kinds(observe(t, readings=NO_READINGS)) == [("row_remap_failure", 0)]
    assert observe(t, readings=Readings(row_remap_failure=False)) == ()


def test_unsupported_reads_are_never_faults(clock: Clock):
    """A GPU that supports none of the reads (every one None) is healthy."""
    t = tracker(clock)
    for _ in range(3):
        assert observe(t, readings=Readings(failed_reads=("power_draw", "ecc"))) == ()


def test_events_without_a_uuid_attach_to_the_index_or_are_dropped(clock: Clock):
    """An event whose UUID could not be read goes to the UUID last seen at its index; one
    for an index never identified has nothing to attach to."""
    t = tracker(clock)
    observe(t)
    t.take_events([xid(79, uuid=None), xid(48, uuid=None, index=5)])
    assert kinds(observe(t)) == [("xid", 79)]


def test_distinct_xid_codes_are_bounded_per_gpu(clock: Clock):
    """Thousands of distinct unknown XID numbers keep at most FAULTS_PER_GPU_LIMIT faults,
    the most recent ones."""
    t = tracker(clock)
    for code in range(1000, 3000):
        clock.advance(0.001)
        t.take_events([xid(code)])
    faults = observe(t)
    assert len(faults) == FAULTS_PER_GPU_LIMIT
    assert min(f.code for f in faults) == 3000 - FAULTS_PER_GPU_LIMIT


@pytest.mark.parametrize(
    ("text", "allow_all", "expected"),
    [
        ("13,31, 43", False, (frozenset({13, 31, 43}), False)),
        ("", False, (frozenset(), False)),
        ("all", True, (frozenset(), True)),
        ("ALL", True, (frozenset(), True)),
    ],
)
def test_xid_lists_parse(text: str, allow_all: bool, expected):
    """Comma-separated XID numbers, spaces allowed, '' for none, 'all' where allowed."""
    assert parse_xids(text, option="--xid-ignore", allow_all=allow_all) == expected


@pytest.mark.parametrize("text", ["13,x", "0", "-1", "13,,31", "4294967296", "all", "\uff11\uff13"])
def test_bad_xid_lists_are_one_clear_error(text: str):
    """Anything but XID numbers (1 to 2^32-1) is a ConfigError naming the flag and the item."""
    with pytest.raises(ConfigError, match=r"--xid-fatal: .* is not an XID number"):
        parse_xids(text, option="--xid-fatal", allow_all=False)


def test_a_gpu_lost_before_its_first_cycle_is_known_from_the_inventory(clock: Clock):
    """The UUIDs read at start-up identify the GPUs, so one lost before any cycle read it
    still gets its gpu_lost fault (and the XIDs without a UUID find it)."""
    t = tracker(clock)
    t.identified({0: UUID, 1: None})
    assert kinds(observe(t, uuid=None, error=GpuErrorClass.GPU_IS_LOST, uuid_failed=True)) == [
        ("gpu_lost", 0)
    ]
    assert observe(t, uuid=None, index=1, error=GpuErrorClass.GPU_IS_LOST, uuid_failed=True) == ()
