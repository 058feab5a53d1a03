"""The fake libnvidia-ml.so.1's health and event entry points, called directly through
ctypes (as nvml.h declares them), and their config-file directives."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from capwatch.agent.health.telemetry import DeviceEventKind, ThrottleReason
from capwatch.agent.nvml.backend import NvmlBackend
from tests.fakenvml.control import (
    DEFAULT_UUIDS,
    EVENT_DOUBLE_BIT_ECC,
    EVENT_SINGLE_BIT_ECC,
    EVENT_XID,
    MAX_QUEUED_EVENTS,
    SONAME,
    FakeConfig,
    FakeDevice,
    FakeNvml,
    QueuedEvent,
)

pytestmark = pytest.mark.nvml

REPO_ROOT = Path(__file__).resolve().parents[2]
SUCCESS, INVALID_ARGUMENT, NOT_SUPPORTED, TIMEOUT, GPU_IS_LOST = 0, 2, 3, 10, 15
UNINITIALIZED = 1

NEW_FUNCTIONS = (
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetIndex",
    "nvmlEventSetCreate",
    "nvmlDeviceRegisterEvents",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlEventSetWait_v2",
    "nvmlEventSetFree",
)


class EventData(ctypes.Structure):
    """nvmlEventData_t."""

    _fields_ = (
        ("device", ctypes.c_void_p),
        ("eventType", ctypes.c_ulonglong),
        ("eventData", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    )


class Nvml:
    """The fake's NVML entry points through ctypes, with the library initialised."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL(SONAME)
        self.lib.nvmlEventSetWait_v2.argtypes = [
            ctypes.c_void_p,
            ctypes.POINTER(EventData),
            ctypes.c_uint,
        ]
        self.lib.nvmlDeviceRegisterEvents.argtypes = [
            ctypes.c_void_p,
            ctypes.c_ulonglong,
            ctypes.c_void_p,
        ]
        self.lib.nvmlEventSetFree.argtypes = [ctypes.c_void_p]
        assert self.lib.nvmlInit_v2() == SUCCESS

    def handle(self, index: int) -> ctypes.c_void_p:
        handle = ctypes.c_void_p()
        assert self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) == SUCCESS
        return handle

    def event_set(self) -> ctypes.c_void_p:
        event_set = ctypes.c_void_p()
        assert self.lib.nvmlEventSetCreate(ctypes.byref(event_set)) == SUCCESS
        return event_set

    def register(self, index: int, types: int, event_set: ctypes.c_void_p) -> int:
        return int(self.lib.nvmlDeviceRegisterEvents(self.handle(index), types, event_set))

    def wait(self, event_set: ctypes.c_void_p, timeout_ms: int) -> tuple[int, EventData]:
        data = EventData()
        return int(self.lib.nvmlEventSetWait_v2(event_set, ctypes.byref(data), timeout_ms)), data


@pytest.fixture
def nvml(fake_nvml: FakeNvml) -> Nvml:
    """NVML initialised on the reset fake (the fake_nvml fixture resets it afterwards)."""
    return Nvml()


def wait_in_thread(nvml: Nvml, event_set: ctypes.c_void_p, timeout_ms: int) -> list[object]:
    """Start a wait in another thread; returns [rc, data, seconds] once it has returned."""
    out: list[object] = []

    def run() -> None:
        start = time.monotonic()
        rc, data = nvml.wait(event_set, timeout_ms)
        out.extend([rc, data, time.monotonic() - start])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    out.append(thread)
    return out


def delivered(fake_nvml: FakeNvml, timeout: float = 5.0) -> None:
    """Wait until every queued event was taken and the event thread is back in its wait,
    i.e. done adding the last one to the accumulator."""
    until(lambda: fake_nvml.pending_events() == 0 and fake_nvml.event_waiters() == 1, timeout)


def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.002)


def test_every_new_function_is_counted_and_faultable(fake_nvml: FakeNvml) -> None:
    """Each new entry point has a name the fault injection and call counts know."""
    for name in NEW_FUNCTIONS:
        assert fake_nvml.call_count(name) == 0
        fake_nvml.inject(name, None, "NVML_ERROR_NOT_SUPPORTED", times=1)


def test_wait_times_out(fake_nvml: FakeNvml, nvml: Nvml) -> None:
    """With nothing queued a wait blocks for its timeout, then returns NVML_ERROR_TIMEOUT."""
    event_set = nvml.event_set()
    assert nvml.register(0, EVENT_XID, event_set) == SUCCESS
    start = time.monotonic()
    rc, _ = nvml.wait(event_set, 150)
    assert rc == TIMEOUT
    # Not sooner than its timeout; the upper bound (20 x) only says it did return.
    assert 0.14 <= time.monotonic() - start < 3.0


def test_wait_wakes_promptly_with_the_xid(fake_nvml: FakeNvml, nvml: Nvml) -> None:
    """A blocked wait returns as soon as an event is queued, with the device's handle,
    the type, the XID as eventData and no MIG instance."""
    event_set = nvml.event_set()
    assert nvml.register(1, EVENT_XID | EVENT_DOUBLE_BIT_ECC, event_set) == SUCCESS
    out = wait_in_thread(nvml, event_set, 60_000)
    until(lambda: fake_nvml.event_waiters() == 1)
    fake_nvml.queue_xid(1, 79)
    out[0].join(10)  # type: ignore[attr-defined]
    assert not out[0].is_alive(), "the event did not wake the wait"  # type: ignore[attr-defined]
    _, rc, data, seconds = out
    assert rc == SUCCESS
    assert isinstance(data, EventData)
    assert data.device == nvml.handle(1).value
    assert (data.eventType, data.eventData) == (EVENT_XID, 79)
    assert (data.gpuInstanceId, data.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)
    assert isinstance(seconds, float)
    assert seconds < 10  # woken, not timed out: a hang guard far inside its 60 s timeout


def test_only_registered_devices_and_types_are_delivered(fake_nvml: FakeNvml, nvml: Nvml) -> None:
    """A set gets events only for what it registered, oldest first; the rest stay queued.
    eventData is 0 for anything but an XID."""
    event_set = nvml.event_set()
    assert nvml.register(0, EVENT_DOUBLE_BIT_ECC, event_set) == SUCCESS
    fake_nvml.queue_xid(0, 13)  # type not registered
    fake_nvml.queue_xid(1, 13)  # device not registered
    fake_nvml.queue_event(QueuedEvent(index=0, event_type=EVENT_DOUBLE_BIT_ECC, data=7))
    fake_nvml.queue_event(QueuedEvent(index=0, event_type=EVENT_DOUBLE_BIT_ECC, data=8))
    rc, data = nvml.wait(event_set, 0)
    assert (rc, data.eventType, data.eventData) == (SUCCESS, EVENT_DOUBLE_BIT_ECC, 0)
    assert nvml.wait(event_set, 0)[0] == SUCCESS
    assert nvml.wait(event_set, 0)[0] == TIMEOUT
    assert fake_nvml.pending_events() == 2


def test_registration_is_per_set_and_checked(fake_nvml: FakeNvml, nvml: Nvml) -> None:
    """Registered masks are kept per device per set; asking for a type the device does not
    support is NOT_SUPPORTED and registers nothing; supported types read back."""
    fake_nvml.set_supported_events(1, EVENT_XID)
    first, second = nvml.event_set(), nvml.event_set()
    assert nvml.register(0, EVENT_XID, first) == SUCCESS
    assert nvml.register(0, EVENT_DOUBLE_BIT_ECC, second) == SUCCESS
    assert nvml.register(1, EVENT_XID | EVENT_DOUBLE_BIT_ECC, first) == NOT_SUPPORTED
    assert fake_nvml.registered_events(0) == EVENT_XID | EVENT_DOUBLE_BIT_ECC
    assert fake_nvml.registered_events(1) == 0
    types = ctypes.c_ulonglong()
    rc = nvml.lib.nvmlDeviceGetSupportedEventTypes(nvml.handle(1), ctypes.byref(types))
    assert (rc, types.value) == (SUCCESS, EVENT_XID)
    fake_nvml.queue_event(QueuedEvent(index=0, event_type=EVENT_DOUBLE_BIT_ECC))
    assert nvml.wait(first, 0)[0] == TIMEOUT
    assert nvml.wait(second, 0)[0] == SUCCESS
    assert nvml.lib.nvmlEventSetFree(second) == SUCCESS
    assert fake_nvml.registered_events(0) == EVENT_XID
    assert fake_nvml.event_sets() == 1


def test_free_wakes_a_waiter(fake_nvml: FakeNvml, nvml: Nvml) -> None:
    """Freeing a set wakes its waiter at once with INVALID_ARGUMENT; the handle is dead."""
    event_set = nvml.event_set()
    out = wait_in_thread(nvml, event_set, 60_000)
    until(lambda: fake_nvml.event_waiters() == 1)
    assert nvml.lib.nvmlEventSetFree(event_set) == SUCCESS
    out[0].join(10)  # type: ignore[attr-defined]
    assert not out[0].is_alive(), "freeing the set did not wake the wait"  # type: ignore[attr-defined]
    assert out[1] == INVALID_ARGUMENT
    assert out[3] < 10  # type: ignore[operator]  # a hang guard far inside its 60 s timeout
    assert nvml.lib.nvmlEventSetFree(event_set) == INVALID_ARGUMENT
    assert nvml.wait(event_set, 0)[0] == INVALID_ARGUMENT


def test_last_shutdown_wakes_a_waiter(fake_nvml: FakeNvml, nvml: Nvml) -> None:
    """The last nvmlShutdown releases every set and wakes waiters with UNINITIALIZED."""
    event_set = nvml.event_set()
    out = wait_in_thread(nvml, event_set, 5000)
    until(lambda: fake_nvml.event_waiters() == 1)
    assert nvml.lib.nvmlShutdown() == SUCCESS
    out[0].join(5)  # type: ignore[attr-defined]
    assert out[1] == UNINITIALIZED
    assert fake_nvml.event_sets() == 0


def test_queue_is_bounded(fake_nvml: FakeNvml, nvml: Nvml) -> None:
    """The queue holds MAX_QUEUED_EVENTS; more are dropped and counted; taking events
    makes room again."""
    assert fake_nvml.queue_xid(0, 31, count=MAX_QUEUED_EVENTS + 5) == MAX_QUEUED_EVENTS
    assert fake_nvml.dropped_events() == 5
    assert fake_nvml.queue_xid(1, 31) == 0
    event_set = nvml.event_set()
    assert nvml.register(0, EVENT_XID, event_set) == SUCCESS
    for _ in range(3):
        assert nvml.wait(event_set, 0)[0] == SUCCESS
    assert fake_nvml.queue_xid(1, 32, count=4) == 3
    assert fake_nvml.pending_events() == MAX_QUEUED_EVENTS
    assert fake_nvml.dropped_events() == 7


def test_lost_gpu_answers_gpu_is_lost_until_restored(fake_nvml: FakeNvml, nvml: Nvml) -> None:
    """Every call naming a lost GPU returns GPU_IS_LOST; restored, it is the same GPU."""
    handle = nvml.handle(1)
    fake_nvml.set_lost(1)
    value = ctypes.c_uint()
    assert nvml.lib.nvmlDeviceGetPowerUsage(handle, ctypes.byref(value)) == GPU_IS_LOST
    assert nvml.lib.nvmlDeviceGetIndex(handle, ctypes.byref(value)) == GPU_IS_LOST
    other = ctypes.c_void_p()
    assert nvml.lib.nvmlDeviceGetHandleByIndex_v2(1, ctypes.byref(other)) == GPU_IS_LOST
    assert nvml.lib.nvmlDeviceGetPowerUsage(nvml.handle(0), ctypes.byref(value)) == SUCCESS
    fake_nvml.set_lost(1, lost=False)
    assert nvml.lib.nvmlDeviceGetIndex(handle, ctypes.byref(value)) == SUCCESS
    assert value.value == 1
    assert fake_nvml.device_uuid(1) == DEFAULT_UUIDS[1]


def test_ecc_counter_kinds(fake_nvml: FakeNvml, nvml: Nvml) -> None:
    """Uncorrected counts are the configured count, corrected ones 0, bad enums rejected."""
    fake_nvml.set_ecc_errors(0, 9)
    count = ctypes.c_ulonglong()
    fn = nvml.lib.nvmlDeviceGetTotalEccErrors
    assert fn(nvml.handle(0), 1, 0, ctypes.byref(count)) == SUCCESS  # uncorrected, volatile
    assert count.value == 9
    assert fn(nvml.handle(0), 0, 0, ctypes.byref(count)) == SUCCESS  # corrected
    assert count.value == 0
    assert fn(nvml.handle(0), 5, 0, ctypes.byref(count)) == INVALID_ARGUMENT


def test_health_and_event_directives(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    """The config file sets every health value and queues events, as the backend reads them."""
    path = tmp_path / "health.conf"
    path.write_text(
        textwrap.dedent(
            """
            devices 3
            device 0 draw=222000 enforced=250000 clocks=0x4 ecc=2 remap_pending=1
            device 1 older_part=1 retired_pending=1 events=0x8 remap_failure=1
            device 2 lost=1
            event 0 xid 79 count=3
            event 0 dbe
            event 1 0x8 48
            """
        )
    )
    fake_nvml.load_config(path)
    with NvmlBackend(event_wait_ms=20) as backend:
        zero, one, two = (backend.readings(i) for i in range(3))
        assert zero.power_draw_milliwatts == 222_000
        assert zero.enforced_limit_milliwatts == 250_000
        assert zero.throttle_reasons == (ThrottleReason.SW_POWER_CAP,)
        assert zero.ecc_uncorrected_volatile == 2
        assert (zero.row_remap_pending, zero.row_remap_failure) == (True, False)
        assert one.row_remap_failure is None
        assert one.retired_pages_pending is True
        assert two.lost
        assert fake_nvml.registered_events(1) == EVENT_XID
        delivered(fake_nvml)
        got = {(e.kind, e.index, e.code): e.count for e in backend.drain_events()}
    assert got == {
        (DeviceEventKind.XID, 0, 79): 3,
        (DeviceEventKind.ECC_DOUBLE_BIT, 0, 0): 1,
        (DeviceEventKind.XID, 1, 48): 1,
    }


@pytest.mark.parametrize(
    "line",
    [
        "event 0 bogus 1",
        "event 0 xid 79 count=0",
        "event * xid 79",
        "event 0 xid 79 80",
        "device 0 lost=2",
        "device 0 clocks=-1",
        "device 0 enforced=lots",
        "device 0 draw=",
    ],
)
def test_bad_health_or_event_line_is_rejected(
    fake_nvml: FakeNvml, tmp_path: Path, line: str
) -> None:
    """Malformed health options and event lines are refused, naming the line."""
    path = tmp_path / "bad.conf"
    path.write_text(f"devices 2\n{line}\n")
    with pytest.raises(ValueError, match="line 2"):
        fake_nvml.load_config(path)


def test_subprocess_gets_health_and_events_from_fake_config(
    fake_nvml_library: Path, tmp_path: Path
) -> None:
    """FakeConfig renders devices' health and queued events for a separate process."""
    config = FakeConfig(
        devices=(
            FakeDevice(uuid="GPU-s0", power_draw_milliwatts=333_000, clocks_event_reasons=0x8),
            FakeDevice(uuid="GPU-s1", older_part=True, lost=True),
        ),
        events=(
            QueuedEvent(index=0, data=13, count=2),
            QueuedEvent(index=0, event_type=EVENT_SINGLE_BIT_ECC),  # never registered
        ),
    ).write(tmp_path / "fake.conf")
    script = textwrap.dedent(
        """
        import time
        from capwatch.agent.nvml.backend import NvmlBackend
        with NvmlBackend(event_wait_ms=20) as b:
            r0, r1 = b.readings(0), b.readings(1)
            print(r0.power_draw_milliwatts, [t.value for t in r0.throttle_reasons], r1.lost)
            counts = {}  # summed over drains: the two may arrive in different ones
            deadline = time.monotonic() + 10
            while sum(counts.values()) < 2 and time.monotonic() < deadline:
                for e in b.drain_events():
                    key = (e.kind.value, e.uuid, e.code)
                    counts[key] = counts.get(key, 0) + e.count
                time.sleep(0.01)
            print(sorted(counts.items()))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "FAKE_NVML_CONFIG": str(config)},
        cwd=REPO_ROOT,
        check=False,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "333000 ['hw_slowdown'] True",
        "[(('xid', 'GPU-s0', 13), 2)]",
    ]


def test_not_supported_injection_on_each_read(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend
) -> None:
    """NOT_SUPPORTED injected on every health read leaves nothing failed and nothing read."""
    for name in NEW_FUNCTIONS[:6]:
        fake_nvml.inject(name, 0, "NVML_ERROR_NOT_SUPPORTED")
    readings = nvml_backend.readings(0)
    assert readings.failed_reads == ()
    assert readings.power_draw_milliwatts is None
    assert readings.retired_pages_pending is None
    assert fake_nvml.call_count("nvmlDeviceGetRetiredPagesPendingStatus", 0) == 1
