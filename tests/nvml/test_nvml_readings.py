"""NvmlBackend.readings() through the real pynvml against the fake library: every read
round-trips, NOT_SUPPORTED is "not available", other errors are named, lost GPUs show."""

from __future__ import annotations

import pytest

from capwatch.agent.health.telemetry import Readings, ThrottleReason
from capwatch.agent.nvml.backend import NvmlBackend
from tests.fakenvml.control import DEFAULT_DRAW_MW, DEFAULT_LIMIT_MW, DEFAULT_UUIDS, FakeNvml

pytestmark = pytest.mark.nvml

# nvmlClocksEventReason* bits, written out from nvml.h (not taken from pynvml).
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
HW_THERMAL_SLOWDOWN = 0x40
ALL_KNOWN = 0x1FF

# Each read, the NVML function behind it, and the Readings field it fills.
READ_FUNCTIONS = {
    "power_draw": "nvmlDeviceGetPowerUsage",
    "enforced_limit": "nvmlDeviceGetEnforcedPowerLimit",
    "throttle_reasons": "nvmlDeviceGetCurrentClocksEventReasons",
    "ecc": "nvmlDeviceGetTotalEccErrors",
    "row_remap": "nvmlDeviceGetRemappedRows",
}
FIELDS = {
    "power_draw": ("power_draw_milliwatts",),
    "enforced_limit": ("enforced_limit_milliwatts",),
    "throttle_reasons": ("throttle_reasons",),
    "ecc": ("ecc_uncorrected_volatile",),
    "row_remap": ("row_remap_pending", "row_remap_failure"),
}


def test_defaults_read_back(nvml_backend: NvmlBackend) -> None:
    """A default fake GPU: draw 150 W, enforced = current limit, no throttling, no ECC,
    no remapping; page retirement is not asked about on a part with row remapping."""
    assert nvml_backend.readings(0) == Readings(
        power_draw_milliwatts=DEFAULT_DRAW_MW,
        enforced_limit_milliwatts=DEFAULT_LIMIT_MW,
        throttle_reasons=(),
        ecc_uncorrected_volatile=0,
        row_remap_pending=False,
        row_remap_failure=False,
    )


def test_power_draw_and_enforced_limit_round_trip(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend
) -> None:
    """Draw and enforced limit are the library's values; the enforced limit follows a
    written cap until it is set apart from it."""
    fake_nvml.set_power_draw(1, 271_500)
    assert nvml_backend.set_limit(1, uuid=DEFAULT_UUIDS[1], milliwatts=250_000).ok
    readings = nvml_backend.readings(1)
    assert readings.power_draw_milliwatts == 271_500
    assert readings.enforced_limit_milliwatts == 250_000
    fake_nvml.set_enforced_limit(1, 200_000)  # e.g. a lower limit from elsewhere
    assert nvml_backend.readings(1).enforced_limit_milliwatts == 200_000
    assert nvml_backend.readings(0).power_draw_milliwatts == DEFAULT_DRAW_MW


@pytest.mark.parametrize(
    ("mask", "reasons"),
    [
        (0, ()),
        (SW_POWER_CAP, (ThrottleReason.SW_POWER_CAP,)),
        (
            HW_THERMAL_SLOWDOWN | HW_SLOWDOWN | SW_POWER_CAP,
            (
                ThrottleReason.HW_SLOWDOWN,
                ThrottleReason.HW_THERMAL_SLOWDOWN,
                ThrottleReason.SW_POWER_CAP,
            ),
        ),
        (SW_POWER_CAP | (1 << 40) | 0x200, (ThrottleReason.SW_POWER_CAP,)),
        (ALL_KNOWN, tuple(sorted(ThrottleReason, key=lambda r: r.value))),
    ],
    ids=["none", "sw-power-cap", "three-sorted", "unknown-bits-dropped", "all"],
)
def test_throttle_reasons_from_masks(
    fake_nvml: FakeNvml,
    nvml_backend: NvmlBackend,
    mask: int,
    reasons: tuple[ThrottleReason, ...],
) -> None:
    """The clock-event mask becomes sorted reasons; bits NVML may add later are dropped."""
    fake_nvml.set_clocks_event_reasons(0, mask)
    assert nvml_backend.readings(0).throttle_reasons == reasons


def test_throttle_reasons_fall_back_to_the_older_name(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend
) -> None:
    """A driver without nvmlDeviceGetCurrentClocksEventReasons (before 535) is read through
    nvmlDeviceGetCurrentClocksThrottleReasons; only when both fail is the read failed."""
    fake_nvml.set_clocks_event_reasons(0, SW_POWER_CAP)
    fake_nvml.inject("nvmlDeviceGetCurrentClocksEventReasons", 0, "NVML_ERROR_FUNCTION_NOT_FOUND")
    readings = nvml_backend.readings(0)
    assert readings.throttle_reasons == (ThrottleReason.SW_POWER_CAP,)
    assert readings.failed_reads == ()
    assert fake_nvml.call_count("nvmlDeviceGetCurrentClocksThrottleReasons", 0) == 1
    fake_nvml.inject("nvmlDeviceGetCurrentClocksEventReasons", 0, "NVML_ERROR_FUNCTION_NOT_FOUND")
    fake_nvml.inject(
        "nvmlDeviceGetCurrentClocksThrottleReasons", 0, "NVML_ERROR_FUNCTION_NOT_FOUND"
    )
    assert nvml_backend.readings(0).failed_reads == ("throttle_reasons",)


def test_ecc_count_round_trips(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    """The volatile uncorrected ECC count is read back, and bumps add up."""
    fake_nvml.set_ecc_errors(0, 3)
    assert nvml_backend.readings(0).ecc_uncorrected_volatile == 3
    fake_nvml.add_ecc_errors(0, 2)
    assert nvml_backend.readings(0).ecc_uncorrected_volatile == 5
    assert nvml_backend.readings(1).ecc_uncorrected_volatile == 0


@pytest.mark.parametrize(("pending", "failure"), [(True, False), (False, True), (True, True)])
def test_row_remap_state_round_trips(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend, pending: bool, failure: bool
) -> None:
    """Pending and failed row remapping are reported as set."""
    fake_nvml.set_row_remap(1, pending=pending, failure=failure)
    readings = nvml_backend.readings(1)
    assert (readings.row_remap_pending, readings.row_remap_failure) == (pending, failure)
    assert readings.retired_pages_pending is None
    assert readings.failed_reads == ()


@pytest.mark.parametrize("pending", [True, False])
def test_older_part_reports_retired_pages(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend, pending: bool
) -> None:
    """On a part without row remapping (NOT_SUPPORTED) the page-retirement state is read
    instead, and nothing counts as failed."""
    fake_nvml.set_older_part(0, older_part=True, retired_pending=pending)
    readings = nvml_backend.readings(0)
    assert readings.row_remap_pending is None
    assert readings.row_remap_failure is None
    assert readings.retired_pages_pending is pending
    assert readings.failed_reads == ()


@pytest.mark.parametrize("read", list(READ_FUNCTIONS))
def test_not_supported_read_is_none_and_not_failed(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend, read: str
) -> None:
    """A read the device does not support is None, not in failed_reads; the others work."""
    fake_nvml.inject(READ_FUNCTIONS[read], 0, "NVML_ERROR_NOT_SUPPORTED")
    readings = nvml_backend.readings(0)
    for field in FIELDS[read]:
        assert getattr(readings, field) is None
    assert readings.failed_reads == ()
    assert not readings.lost
    assert readings.power_draw_milliwatts is not None or read == "power_draw"
    assert nvml_backend.readings(1).failed_reads == ()


@pytest.mark.parametrize("read", list(READ_FUNCTIONS))
@pytest.mark.parametrize("error", ["NVML_ERROR_UNKNOWN", "NVML_ERROR_NO_PERMISSION", 4242])
def test_failed_read_is_none_and_named(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend, read: str, error: str | int
) -> None:
    """A read failing otherwise is None and named in failed_reads; the GPU is not lost,
    and a failed row-remap read does not fall back to page retirement."""
    fake_nvml.inject(READ_FUNCTIONS[read], 0, error)
    readings = nvml_backend.readings(0)
    for field in FIELDS[read]:
        assert getattr(readings, field) is None
    assert readings.failed_reads == (read,)
    assert not readings.lost
    assert readings.retired_pages_pending is None
    assert fake_nvml.call_count("nvmlDeviceGetRetiredPagesPendingStatus") == 0


def test_failed_retired_pages_read_is_named(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    """On an older part a failing page-retirement read is named too."""
    fake_nvml.set_older_part(1, older_part=True, retired_pending=True)
    fake_nvml.inject("nvmlDeviceGetRetiredPagesPendingStatus", 1, "NVML_ERROR_UNKNOWN")
    readings = nvml_backend.readings(1)
    assert readings.retired_pages_pending is None
    assert readings.failed_reads == ("retired_pages",)


def test_gpu_failing_every_read(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    """A GPU that errors on every read shows every read failed (not "supports nothing"),
    and the other GPU is unaffected."""
    for function in READ_FUNCTIONS.values():
        fake_nvml.inject(function, 1, "NVML_ERROR_UNKNOWN")
    readings = nvml_backend.readings(1)
    assert readings.failed_reads == tuple(READ_FUNCTIONS)
    assert readings.power_draw_milliwatts is None
    assert readings.throttle_reasons is None
    assert not readings.lost
    assert nvml_backend.readings(0).failed_reads == ()


def test_unreachable_handle_fails_every_read(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend
) -> None:
    """If even the handle cannot be had, every read is failed, none is attempted."""
    fake_nvml.inject("nvmlDeviceGetHandleByIndex", 0, "NVML_ERROR_UNKNOWN", times=1)
    readings = nvml_backend.readings(0)
    assert readings.failed_reads == tuple(READ_FUNCTIONS)
    assert not readings.lost
    assert fake_nvml.call_count("nvmlDeviceGetPowerUsage") == 0


def test_lost_gpu_then_restored(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    """A lost GPU reads lost=True with nothing read; restored, it reads normally again
    with the same UUID; the other GPU never notices."""
    fake_nvml.set_lost(1)
    lost = nvml_backend.readings(1)
    assert lost.lost
    assert lost.power_draw_milliwatts is None
    assert lost.failed_reads == tuple(READ_FUNCTIONS)
    assert not nvml_backend.readings(0).lost
    fake_nvml.set_lost(1, lost=False)
    back = nvml_backend.readings(1)
    assert not back.lost
    assert back.failed_reads == ()
    assert back.power_draw_milliwatts == DEFAULT_DRAW_MW
    assert nvml_backend.uuid(1) == DEFAULT_UUIDS[1]


def test_lost_on_one_read_only(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    """GPU_IS_LOST from a single read marks the readings lost and names that read."""
    fake_nvml.inject("nvmlDeviceGetTotalEccErrors", 0, "NVML_ERROR_GPU_IS_LOST", times=1)
    readings = nvml_backend.readings(0)
    assert readings.lost
    assert readings.failed_reads == ("ecc",)
    assert readings.power_draw_milliwatts == DEFAULT_DRAW_MW
    assert not nvml_backend.readings(0).lost


def test_closed_backend_reads_nothing(fake_nvml: FakeNvml) -> None:
    """After close, readings are empty and no NVML read is made."""
    backend = NvmlBackend.open(event_wait_ms=20)
    backend.close()
    assert backend.readings(0) == Readings()
    assert fake_nvml.call_count("nvmlDeviceGetPowerUsage") == 0
