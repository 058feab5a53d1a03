"""NvmlBackend's device events through the real pynvml against the fake library: XID and
double-bit ECC events queued in the fake reach drain_events(), mapped to index and UUID,
aggregated and bounded; the event thread survives errors and stops promptly."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from capwatch.agent.gpus import GpuError, GpuErrorClass
from capwatch.agent.health.telemetry import EVENT_KEYS_LIMIT, DeviceEventKind, EventAccumulator
from capwatch.agent.nvml.backend import NvmlBackend
from capwatch.agent.nvml.event_watch import (
    BACKOFF_MAX_S,
    BACKOFF_MIN_S,
    THREAD_NAME,
    EventWatch,
    RawEvent,
)
from tests.fakenvml.control import (
    DEFAULT_UUIDS,
    EVENT_DOUBLE_BIT_ECC,
    EVENT_XID,
    FakeDevice,
    FakeNvml,
    QueuedEvent,
)

pytestmark = pytest.mark.nvml

XID, DBE = DeviceEventKind.XID, DeviceEventKind.ECC_DOUBLE_BIT
Key = tuple[DeviceEventKind, int, str | None, int]


def collect(backend: NvmlBackend, total: int, timeout: float = 10.0) -> dict[Key, int]:
    """Drain until ``total`` events arrived; counts by (kind, index, uuid, code)."""
    merged: dict[Key, int] = {}
    deadline = time.monotonic() + timeout
    while True:
        for event in backend.drain_events():
            key = (event.kind, event.index, event.uuid, event.code)
            merged[key] = merged.get(key, 0) + event.count
        if sum(merged.values()) >= total:
            return merged
        assert time.monotonic() < deadline, f"only {merged} of {total} events arrived"
        time.sleep(0.01)


def event_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


def delivered(fake_nvml: FakeNvml, timeout: float = 5.0) -> None:
    """Wait until every queued event was taken and the event thread is back in its wait,
    i.e. done adding the last one to the accumulator."""
    until(lambda: fake_nvml.pending_events() == 0 and fake_nvml.event_waiters() == 1, timeout)


def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


@pytest.fixture
def four_gpus(fake_nvml: FakeNvml) -> Iterator[NvmlBackend]:
    """Four fake GPUs GPU-e0..GPU-e3 and a backend on them (short event waits)."""
    fake_nvml.configure([FakeDevice(uuid=f"GPU-e{i}") for i in range(4)])
    backend = NvmlBackend.open(event_wait_ms=20)
    yield backend
    backend.close()


def test_every_device_registered_for_xid_and_dbe(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend
) -> None:
    """At open one event set is created and each device registered for exactly XID and
    double-bit ECC events; close frees the set."""
    assert fake_nvml.event_sets() == 1
    for index in range(2):
        assert fake_nvml.registered_events(index) == EVENT_XID | EVENT_DOUBLE_BIT_ECC
    nvml_backend.close()
    assert fake_nvml.event_sets() == 0
    assert fake_nvml.init_count() == 0


def test_xid_events_reach_drain_aggregated(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    """Three XID 79 events on GPU 1 drain as one entry with index, UUID, code and count 3."""
    fake_nvml.queue_xid(1, 79, count=3)
    delivered(fake_nvml)
    events = nvml_backend.drain_events() + nvml_backend.drain_events()
    assert len(events) == 1
    (event,) = events
    assert (event.kind, event.index, event.uuid, event.code, event.count) == (
        XID,
        1,
        DEFAULT_UUIDS[1],
        79,
        3,
    )
    assert event.first_wall <= event.last_wall
    assert nvml_backend.drain_events() == ()


def test_double_bit_ecc_event(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    """A double-bit ECC event is ECC_DOUBLE_BIT with code 0, and the count is read too."""
    fake_nvml.add_ecc_errors(0, 1, with_event=True)
    assert collect(nvml_backend, 1) == {(DBE, 0, DEFAULT_UUIDS[0], 0): 1}
    assert nvml_backend.readings(0).ecc_uncorrected_volatile == 1


def test_events_for_several_devices(fake_nvml: FakeNvml, four_gpus: NvmlBackend) -> None:
    """Events on different GPUs are told apart by index and UUID, and by kind and code."""
    fake_nvml.queue_xid(0, 13)
    fake_nvml.queue_xid(2, 48, count=2)
    fake_nvml.queue_xid(3, 79)
    fake_nvml.queue_xid(3, 13)
    fake_nvml.queue_event(QueuedEvent(index=1, event_type=EVENT_DOUBLE_BIT_ECC))
    assert collect(four_gpus, 6) == {
        (XID, 0, "GPU-e0", 13): 1,
        (XID, 2, "GPU-e2", 48): 2,
        (XID, 3, "GPU-e3", 79): 1,
        (XID, 3, "GPU-e3", 13): 1,
        (DBE, 1, "GPU-e1", 0): 1,
    }


def test_close_stops_the_thread_within_its_join_window(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    """With the production wait (500 ms), close() stops the named event thread within the
    window it joins it for (one wait and half a second: it never has to say the thread did
    not stop in time), frees the set and shuts NVML down."""
    backend = NvmlBackend.open()
    until(lambda: fake_nvml.event_waiters() == 1)
    assert len(event_threads()) == 1
    assert event_threads()[0].daemon
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="capwatch.agent.nvml.event_watch"):
        backend.close()
    # A hang guard only: close() bounds its own join, and the warning below says
    # whether the thread stopped within it.
    assert time.monotonic() - start < 10
    assert "did not stop in time" not in caplog.text
    assert event_threads() == []
    assert fake_nvml.event_waiters() == 0
    assert fake_nvml.event_sets() == 0
    assert fake_nvml.init_count() == 0


def test_flood_is_one_entry_and_drains_fast(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    """10,000 XIDs of one code between drains are one entry with the full count, never
    10,000 objects (what such a drain costs against a drain of one event is measured by
    bench/scenarios/events.py, not here)."""
    assert fake_nvml.queue_xid(0, 31, count=10_000) == 10_000
    delivered(fake_nvml, timeout=30)
    events = nvml_backend.drain_events()
    events += nvml_backend.drain_events()
    assert [(e.kind, e.index, e.code) for e in events] == [(XID, 0, 31)] * len(events)
    assert sum(e.count for e in events) == 10_000
    assert len(events) <= 2  # at most one per drain


def test_distinct_codes_stay_within_the_key_bound(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend, caplog: pytest.LogCaptureFixture
) -> None:
    """More distinct codes than the accumulator keeps between two drains: it holds
    EVENT_KEYS_LIMIT entries and says how many it dropped (what a drain of a full
    accumulator costs is measured by bench/scenarios/events.py, not here)."""
    extra = 200
    for code in range(EVENT_KEYS_LIMIT + extra):
        fake_nvml.queue_xid(1, code)
    delivered(fake_nvml, timeout=30)
    with caplog.at_level(logging.WARNING, logger="capwatch.agent.health.telemetry"):
        events = nvml_backend.drain_events()
    assert len(events) == EVENT_KEYS_LIMIT
    assert {e.code for e in events} == set(range(EVENT_KEYS_LIMIT))
    assert f"dropped={extra}" in caplog.text


def test_thread_survives_wait_errors(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend, caplog: pytest.LogCaptureFixture
) -> None:
    """Failing waits (unknown error, GPU lost) are logged, rate-limited, and the thread
    goes on delivering events afterwards."""
    with caplog.at_level(logging.WARNING, logger="capwatch.agent.nvml.event_watch"):
        before = fake_nvml.call_count("nvmlEventSetWait")
        fake_nvml.inject("nvmlEventSetWait", None, "NVML_ERROR_UNKNOWN", times=2)
        fake_nvml.inject("nvmlEventSetWait", None, "NVML_ERROR_GPU_IS_LOST", times=1)
        # The wait in progress when the faults went in entered before them: an event
        # queued now could wake it and be collected before any wait failed. So the
        # event is queued only once the three failing waits have run and a fourth
        # (after their back-off) is blocked.
        until(lambda: fake_nvml.call_count("nvmlEventSetWait") - before >= 4)
        until(lambda: fake_nvml.event_waiters() == 1)
        fake_nvml.queue_xid(0, 62)
        assert collect(nvml_backend, 1) == {(XID, 0, DEFAULT_UUIDS[0], 62): 1}
    warnings = [r for r in caplog.records if "event wait failed" in r.getMessage()]
    assert len(warnings) == 1  # the next two within the minute are held back
    assert "error_class=unknown" in warnings[0].getMessage()
    assert len(event_threads()) == 1


def test_wait_errors_never_spin(fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture) -> None:
    """A wait failing every time is retried with back-off through the real library: the
    fourth failing call comes only after the first three back-offs (0.05 + 0.1 + 0.2 s;
    a spinning thread would make it within milliseconds), events flow once it recovers,
    and close() during the back-offs returns without the thread outliving its join (the
    exact delays, and close() cutting a 2 s back-off, are pinned on virtual time below)."""
    backend = NvmlBackend.open(event_wait_ms=20)
    try:
        fake_nvml.inject("nvmlEventSetWait", None, "NVML_ERROR_UNKNOWN")
        injected = time.monotonic()
        before = fake_nvml.call_count("nvmlEventSetWait")
        # Every call counted from here entered after the fault went in, so failed.
        until(lambda: fake_nvml.call_count("nvmlEventSetWait") - before >= 4)
        # A lower bound only: real back-offs last at least what they were asked for.
        assert time.monotonic() - injected >= 0.9 * (BACKOFF_MIN_S * (1 + 2 + 4))
        fake_nvml.clear_faults()
        fake_nvml.queue_xid(1, 94)
        assert collect(backend, 1) == {(XID, 1, DEFAULT_UUIDS[1], 94): 1}
        fake_nvml.inject("nvmlEventSetWait", None, "NVML_ERROR_UNKNOWN")
        failing = fake_nvml.call_count("nvmlEventSetWait")
        until(lambda: fake_nvml.call_count("nvmlEventSetWait") > failing)  # backing off now
    finally:
        start = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="capwatch.agent.nvml.event_watch"):
            backend.close()
    # close() interrupts the back-off: the thread stops within the join window (no
    # warning that it did not); the time is only a hang guard.
    assert time.monotonic() - start < 10
    assert "did not stop in time" not in caplog.text
    assert event_threads() == []


class FailingWaits:
    """The NVML calls of an EventWatch on no device: each wait does what ``outcomes`` says
    in turn ("fail": an unknown error, "timeout": nothing happened), then fails for ever."""

    def __init__(self, outcomes: list[str] | None = None) -> None:
        self.outcomes = list(outcomes or [])
        self.waits = 0

    def supported_types(self, handle: object) -> int:
        return 0

    def register(self, handle: object, event_types: int) -> None:
        raise AssertionError("no device is registered")

    def wait(self, timeout_ms: int) -> RawEvent:
        self.waits += 1
        outcome = self.outcomes.pop(0) if self.outcomes else "fail"
        if outcome == "timeout":
            raise GpuError("nvmlEventSetWait: Timeout", error_class=GpuErrorClass.TIMEOUT)
        raise GpuError("nvmlEventSetWait: Unknown Error", error_class=GpuErrorClass.UNKNOWN)

    def index_of(self, handle: object) -> int:
        raise AssertionError("no event arrives")

    def uuid_of(self, handle: object) -> str:
        raise AssertionError("no event arrives")

    def key_of(self, handle: object) -> int | None:
        return None

    def free(self) -> None:
        pass


class BackOffs(threading.Event):
    """An EventWatch's stop event on virtual time: each back-off asked of it is recorded
    and returns at once, until ``stop_after`` of them (then the watch is stopped); from
    back-off number ``real_from`` on it really waits, and ``in_real`` says one has begun."""

    def __init__(self, *, stop_after: int | None = None, real_from: int | None = None) -> None:
        super().__init__()
        self.asked: list[float] = []
        self.stop_after, self.real_from = stop_after, real_from
        self.in_real = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None, "a back-off is always bounded"
        self.asked.append(timeout)
        if self.real_from is not None and len(self.asked) >= self.real_from:
            self.in_real.set()
            return super().wait(timeout)
        if self.stop_after is not None and len(self.asked) >= self.stop_after:
            self.set()
        return self.is_set()


def watch_on(calls: FailingWaits, backoffs: BackOffs) -> EventWatch:
    """An EventWatch on ``calls`` whose back-offs go through ``backoffs`` (its private stop
    event: the module has no clock for its back-off, and the delays must not be slept)."""
    watch = EventWatch(calls, EventAccumulator(), watched={XID: EVENT_XID}, wait_ms=20)
    watch._stop = backoffs
    return watch


def test_wait_errors_back_off_doubling_to_the_cap_and_a_quiet_wait_resets_it() -> None:
    """Each failed wait backs off before the next: BACKOFF_MIN_S, doubling up to
    BACKOFF_MAX_S and staying there; a wait that ends normally (a timeout) starts the
    doubling again from the minimum. Virtual time: no back-off is slept."""
    calls = FailingWaits(["fail"] * 9 + ["timeout"] + ["fail"] * 2)
    backoffs = BackOffs(stop_after=11)
    watch = watch_on(calls, backoffs)
    watch.start()
    watch.thread.join(10)  # a hang guard: nothing here waits on the wall clock
    assert not watch.thread.is_alive()
    assert backoffs.asked == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0, 0.05, 0.1]
    assert (BACKOFF_MIN_S, BACKOFF_MAX_S) == (0.05, 2.0)
    assert watch.errors == 11
    assert calls.waits == 12  # one wait after each back-off, none in between
    watch.close()


def test_close_cuts_a_long_back_off(caplog: pytest.LogCaptureFixture) -> None:
    """close() during a 2 s back-off (four times its join window) wakes the thread at once:
    it stops within the window, so close() never has to say it did not."""
    calls = FailingWaits()
    backoffs = BackOffs(real_from=7)  # the six before return at once; the 7th is 2 s
    watch = watch_on(calls, backoffs)
    watch.start()
    assert backoffs.in_real.wait(10), "the thread never reached its long back-off"
    assert backoffs.asked[-1] == BACKOFF_MAX_S
    with caplog.at_level(logging.WARNING, logger="capwatch.agent.nvml.event_watch"):
        watch.close()
    assert not watch.thread.is_alive()
    assert "did not stop in time" not in caplog.text
    assert calls.waits == 7  # no wait after the back-off close() cut


def test_event_from_a_lost_gpu(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    """An event whose GPU answers nothing (lost) keeps the index it was registered at,
    with no UUID; the thread carries on."""
    fake_nvml.set_lost(1)
    fake_nvml.queue_xid(1, 79)
    assert collect(nvml_backend, 1) == {(XID, 1, None, 79): 1}
    fake_nvml.set_lost(1, lost=False)
    fake_nvml.queue_xid(1, 79)
    assert collect(nvml_backend, 1) == {(XID, 1, DEFAULT_UUIDS[1], 79): 1}


def test_unreadable_event_uuid_is_none(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    """If the event device's UUID read fails, the event still counts, with uuid None."""
    fake_nvml.inject("nvmlDeviceGetUUID", 0, "NVML_ERROR_UNKNOWN", times=1)
    fake_nvml.queue_xid(0, 45)
    assert collect(nvml_backend, 1) == {(XID, 0, None, 45): 1}


def test_device_that_appears_later_is_registered_when_read(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend
) -> None:
    """A GPU added after open is registered the first time its readings are taken; its
    events then arrive (queued before that, they wait in the library: the event thread
    has been through a whole wait since it was queued and left it there)."""
    fake_nvml.set_device_count(3)
    waits = fake_nvml.call_count("nvmlEventSetWait")
    fake_nvml.queue_xid(2, 79)
    # Two waits entered since: the first of them ended with the event already queued.
    until(lambda: fake_nvml.call_count("nvmlEventSetWait") >= waits + 2)
    assert fake_nvml.pending_events() == 1
    assert fake_nvml.registered_events(2) == 0
    nvml_backend.readings(2)
    assert fake_nvml.registered_events(2) == EVENT_XID | EVENT_DOUBLE_BIT_ECC
    assert collect(nvml_backend, 1) == {(XID, 2, "GPU-fa4e0000-0000-4000-8000-000000000002", 79): 1}
    nvml_backend.readings(2)
    assert fake_nvml.call_count("nvmlDeviceRegisterEvents", 2) == 1


def test_partial_and_no_event_support(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    """A GPU supporting only XIDs is registered for XIDs only; one supporting neither is
    logged once, not registered, and is no error."""
    fake_nvml.configure(
        [
            FakeDevice(uuid="GPU-x", supported_events=EVENT_XID),
            FakeDevice(uuid="GPU-none", supported_events=0),
        ]
    )
    with caplog.at_level(logging.INFO, logger="capwatch.agent.nvml.event_watch"):
        backend = NvmlBackend.open(event_wait_ms=20)
        try:
            backend.readings(1)
            backend.readings(1)
            assert fake_nvml.registered_events(0) == EVENT_XID
            assert fake_nvml.registered_events(1) == 0
        finally:
            backend.close()
    notes = [r for r in caplog.records if "supports no XID" in r.getMessage()]
    assert [r.levelno for r in notes] == [logging.INFO]
    assert "index=1" in notes[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_failed_registration_is_retried(fake_nvml: FakeNvml) -> None:
    """A registration that fails at open is retried from the device's next readings."""
    fake_nvml.inject("nvmlDeviceRegisterEvents", 0, "NVML_ERROR_UNKNOWN", times=1)
    backend = NvmlBackend.open(event_wait_ms=20)
    try:
        assert fake_nvml.registered_events(0) == 0
        assert fake_nvml.registered_events(1) == EVENT_XID | EVENT_DOUBLE_BIT_ECC
        backend.readings(0)
        assert fake_nvml.registered_events(0) == EVENT_XID | EVENT_DOUBLE_BIT_ECC
    finally:
        backend.close()


def test_no_event_set_means_no_events_but_a_working_backend(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    """If the event set cannot be created the backend still opens and reads, logs why,
    starts no thread, and drains nothing."""
    fake_nvml.inject("nvmlEventSetCreate", None, "NVML_ERROR_NOT_SUPPORTED")
    with caplog.at_level(logging.WARNING, logger="capwatch.agent.nvml.backend"):
        backend = NvmlBackend.open(event_wait_ms=20)
    try:
        assert "device events unavailable" in caplog.text
        assert event_threads() == []
        fake_nvml.queue_xid(0, 79)
        assert backend.readings(0).failed_reads == ()
        assert backend.drain_events() == ()
    finally:
        backend.close()
    assert fake_nvml.init_count() == 0
