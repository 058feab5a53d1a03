"""NvmlBackend writes: identity binding, typed outcomes, and what reaches the library."""

from __future__ import annotations

from typing import cast

import pytest

from capwatch.agent.gpus import GpuErrorClass, WriteOutcome
from capwatch.agent.nvml.backend import NvmlBackend
from tests.fakenvml.control import DEFAULT_UUIDS, FakeDevice, FakeNvml, WriteLogEntry
from tests.nvml.nvml_codes import CLASSIFIED, CLASSIFIED_IDS

pytestmark = pytest.mark.nvml

SET = "nvmlDeviceSetPowerManagementLimit"
UUID0, UUID1 = DEFAULT_UUIDS
NEW_UUID = "GPU-0e0e0e0e-0000-4000-8000-000000000000"


def test_set_limit_ok(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    """A successful write is OK with the value written, and the device now carries it."""
    result = nvml_backend.set_limit(1, uuid=UUID1, milliwatts=200_000)
    assert result.outcome is WriteOutcome.OK
    assert result.ok
    assert result.applied_milliwatts == 200_000
    assert result.error_class is None
    assert fake_nvml.limit(1) == 200_000
    assert fake_nvml.limit(0) == 300_000
    assert fake_nvml.write_log() == [WriteLogEntry(device=1, uuid=UUID1, milliwatts=200_000, rc=0)]


@pytest.mark.parametrize("error", CLASSIFIED, ids=CLASSIFIED_IDS)
def test_failed_set_limit_is_classified(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend, error: tuple[str, int, GpuErrorClass]
) -> None:
    """A write the library rejects is FAILED with the code's class; the attempt is logged."""
    name, code, error_class = error
    fake_nvml.inject(SET, 0, name, times=1)
    result = nvml_backend.set_limit(0, uuid=UUID0, milliwatts=250_000)
    assert result.outcome is WriteOutcome.FAILED
    assert not result.ok
    assert result.error_class is error_class
    assert result.applied_milliwatts is None
    assert f"code={code}" in result.detail
    assert fake_nvml.write_log() == [
        WriteLogEntry(device=0, uuid=UUID0, milliwatts=250_000, rc=code)
    ]
    assert fake_nvml.limit(0) == 300_000


def test_out_of_range_is_rejected_by_the_library(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend
) -> None:
    """A value outside the device's range fails as INVALID_ARGUMENT; the limit is unchanged."""
    result = nvml_backend.set_limit(0, uuid=UUID0, milliwatts=50_000)
    assert result.outcome is WriteOutcome.FAILED
    assert result.error_class is GpuErrorClass.INVALID_ARGUMENT
    assert [e.rc for e in fake_nvml.write_log()] == [2]
    assert fake_nvml.limit(0) == 300_000


@pytest.mark.parametrize("milliwatts", [-1, 2**32 + 300_000])
def test_value_that_would_wrap_is_never_written(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend, milliwatts: int
) -> None:
    """A value outside unsigned int (ctypes would wrap it to another cap) never reaches NVML."""
    result = nvml_backend.set_limit(0, uuid=UUID0, milliwatts=milliwatts)
    assert result.outcome is WriteOutcome.FAILED
    assert result.error_class is GpuErrorClass.INVALID_ARGUMENT
    assert fake_nvml.call_count(SET) == 0


def test_non_nvml_exception_in_write_is_failed_unknown(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend
) -> None:
    """A ctypes error inside the write call comes back as FAILED/UNKNOWN, not an exception."""
    result = nvml_backend.set_limit(0, uuid=UUID0, milliwatts=cast(int, 250_000.5))
    assert result.outcome is WriteOutcome.FAILED
    assert result.error_class is GpuErrorClass.UNKNOWN
    assert "TypeError" in result.detail
    assert fake_nvml.write_log() == []


@pytest.mark.parametrize("after_calls", [0, 1])
def test_uuid_change_before_write_is_mismatch_and_nothing_written(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend, after_calls: int
) -> None:
    """Re-enumeration between the step's UUID read and the write: IDENTITY_MISMATCH, no write."""
    if after_calls == 1:
        # The step's own read still sees the old UUID; the pre-write re-read sees the new.
        fake_nvml.change_uuid(0, NEW_UUID, after_calls=1)
        step_uuid = nvml_backend.uuid(0)
    else:
        step_uuid = nvml_backend.uuid(0)
        fake_nvml.change_uuid(0, NEW_UUID, after_calls=0)
    assert step_uuid == UUID0
    result = nvml_backend.set_limit(0, uuid=step_uuid, milliwatts=150_000)
    assert result.outcome is WriteOutcome.IDENTITY_MISMATCH
    assert UUID0 in result.detail
    assert NEW_UUID in result.detail
    assert fake_nvml.call_count(SET) == 0
    assert fake_nvml.write_log() == []
    assert fake_nvml.limit(0) == 300_000
    assert fake_nvml.device_uuid(0) == NEW_UUID


def test_swapped_devices_are_not_capped(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    """Writing to index 0 with device 1's UUID (indexes swapped) is a mismatch, not a write."""
    result = nvml_backend.set_limit(0, uuid=UUID1, milliwatts=150_000)
    assert result.outcome is WriteOutcome.IDENTITY_MISMATCH
    assert fake_nvml.write_log() == []


@pytest.mark.parametrize("error", CLASSIFIED, ids=CLASSIFIED_IDS)
def test_failed_prewrite_uuid_read_is_unconfirmed(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend, error: tuple[str, int, GpuErrorClass]
) -> None:
    """A failed pre-write UUID read is IDENTITY_UNCONFIRMED with its class; nothing is written."""
    name, _, error_class = error
    step_uuid = nvml_backend.uuid(0)
    fake_nvml.inject("nvmlDeviceGetUUID", 0, name, times=1)
    result = nvml_backend.set_limit(0, uuid=step_uuid, milliwatts=150_000)
    assert result.outcome is WriteOutcome.IDENTITY_UNCONFIRMED
    assert result.error_class is error_class
    assert fake_nvml.call_count(SET) == 0


def test_failed_prewrite_handle_is_unconfirmed(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend
) -> None:
    """A failure getting the handle is also an unconfirmed identity, for both writes."""
    fake_nvml.inject("nvmlDeviceGetHandleByIndex", 1, "NVML_ERROR_GPU_IS_LOST")
    for result in (
        nvml_backend.set_limit(1, uuid=UUID1, milliwatts=150_000),
        nvml_backend.restore_default(1, uuid=UUID1),
    ):
        assert result.outcome is WriteOutcome.IDENTITY_UNCONFIRMED
        assert result.error_class is GpuErrorClass.GPU_IS_LOST
    assert fake_nvml.call_count(SET) == 0


def test_undecodable_prewrite_uuid_is_unconfirmed(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend
) -> None:
    """A non-NVML error while confirming identity is IDENTITY_UNCONFIRMED/UNKNOWN, no write."""
    fake_nvml.configure_device(0, FakeDevice(uuid=b"GPU-\xff\xfe"))
    result = nvml_backend.set_limit(0, uuid=UUID0, milliwatts=150_000)
    assert result.outcome is WriteOutcome.IDENTITY_UNCONFIRMED
    assert result.error_class is GpuErrorClass.UNKNOWN
    assert fake_nvml.call_count(SET) == 0


def test_restore_default_writes_the_default(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    """restore_default writes the device's default limit, read from the device."""
    fake_nvml.configure_device(
        1, FakeDevice(uuid=UUID1, default_milliwatts=350_000, current_milliwatts=120_000)
    )
    result = nvml_backend.restore_default(1, uuid=UUID1)
    assert result.outcome is WriteOutcome.OK
    assert result.applied_milliwatts == 350_000
    assert fake_nvml.limit(1) == 350_000
    assert fake_nvml.write_log() == [WriteLogEntry(device=1, uuid=UUID1, milliwatts=350_000, rc=0)]


def test_restore_default_mismatch_writes_nothing(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend
) -> None:
    """restore_default is bound to the UUID just like set_limit."""
    fake_nvml.change_uuid(1, NEW_UUID)
    result = nvml_backend.restore_default(1, uuid=UUID1)
    assert result.outcome is WriteOutcome.IDENTITY_MISMATCH
    assert fake_nvml.call_count(SET) == 0


def test_restore_default_with_unreadable_default_fails(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend
) -> None:
    """If the default limit cannot be read, the restore is FAILED with that class, no write."""
    fake_nvml.inject("nvmlDeviceGetPowerManagementDefaultLimit", 0, "NVML_ERROR_NOT_SUPPORTED")
    result = nvml_backend.restore_default(0, uuid=UUID0)
    assert result.outcome is WriteOutcome.FAILED
    assert result.error_class is GpuErrorClass.NOT_SUPPORTED
    assert fake_nvml.call_count(SET) == 0


def test_restore_default_with_failing_write_fails(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend
) -> None:
    """A restore whose write is rejected is FAILED with the class; the attempt is logged."""
    fake_nvml.inject(SET, 0, "NVML_ERROR_NO_PERMISSION")
    result = nvml_backend.restore_default(0, uuid=UUID0)
    assert result.outcome is WriteOutcome.FAILED
    assert result.error_class is GpuErrorClass.NO_PERMISSION
    assert fake_nvml.write_log() == [WriteLogEntry(device=0, uuid=UUID0, milliwatts=300_000, rc=4)]


def test_write_failure_on_one_device_leaves_the_other(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend
) -> None:
    """Faults are per device: device 0 fails, device 1 is written."""
    fake_nvml.inject(SET, 0, "NVML_ERROR_GPU_IS_LOST")
    assert nvml_backend.set_limit(0, uuid=UUID0, milliwatts=200_000).outcome is (
        WriteOutcome.FAILED
    )
    assert nvml_backend.set_limit(1, uuid=UUID1, milliwatts=200_000).ok
    assert [(e.device, e.rc) for e in fake_nvml.write_log()] == [(0, 15), (1, 0)]
