"""NvmlBackend reads through the real pynvml against the fake library."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from capwatch.agent.gpus import GpuError, GpuErrorClass, PowerConstraints
from capwatch.agent.nvml.backend import NvmlBackend
from tests.fakenvml.control import DEFAULT_UUIDS, FakeDevice, FakeNvml
from tests.nvml.nvml_codes import CLASSIFIED, CLASSIFIED_IDS

pytestmark = pytest.mark.nvml


def test_default_devices(nvml_backend: NvmlBackend) -> None:
    """With no configuration the fake shows 2 idle GPUs, 100-400 W, default 300 W."""
    assert nvml_backend.device_count() == 2
    assert [nvml_backend.uuid(i) for i in range(2)] == list(DEFAULT_UUIDS)
    assert nvml_backend.constraints(1) == PowerConstraints(
        min_milliwatts=100_000, max_milliwatts=400_000, default_milliwatts=300_000
    )
    assert nvml_backend.processes(0) == ()


def test_configured_devices_are_read_back(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    """Count, UUIDs, constraints and PIDs come from the library, per device."""
    fake_nvml.configure(
        [
            FakeDevice(uuid="GPU-aaaa", pids=(4242,)),
            FakeDevice(uuid="GPU-bbbb"),
            FakeDevice(
                uuid="GPU-cccc",
                min_milliwatts=150_000,
                max_milliwatts=700_000,
                default_milliwatts=700_000,
                current_milliwatts=500_000,
                pids=(7, 8, 9),
            ),
        ]
    )
    assert nvml_backend.device_count() == 3
    assert [nvml_backend.uuid(i) for i in range(3)] == ["GPU-aaaa", "GPU-bbbb", "GPU-cccc"]
    assert nvml_backend.constraints(2) == PowerConstraints(
        min_milliwatts=150_000, max_milliwatts=700_000, default_milliwatts=700_000
    )
    assert nvml_backend.processes(0) == (4242,)
    assert nvml_backend.processes(1) == ()
    assert nvml_backend.processes(2) == (7, 8, 9)


def test_many_processes_use_the_size_query(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    """A long process list (the INSUFFICIENT_SIZE two-call protocol) comes back whole."""
    pids = tuple(range(1000, 1300))
    fake_nvml.set_processes(1, pids)
    assert nvml_backend.processes(1) == pids
    assert fake_nvml.call_count("nvmlDeviceGetComputeRunningProcesses_v3", 1) == 2


def test_device_count_follows_the_library(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    """The count is read on every call, not cached at init."""
    fake_nvml.set_device_count(5)
    assert nvml_backend.device_count() == 5
    fake_nvml.set_device_count(1)
    assert nvml_backend.device_count() == 1


def test_index_out_of_range_is_invalid_argument(nvml_backend: NvmlBackend) -> None:
    """An index past the device count is the library's INVALID_ARGUMENT, as a GpuError."""
    with pytest.raises(GpuError) as info:
        nvml_backend.uuid(2)
    assert info.value.error_class is GpuErrorClass.INVALID_ARGUMENT
    assert info.value.code == 2


# Each read, and the NVML function whose failure it must surface. Device 1 is
# the faulty one; reads of device 0 must be unaffected.
READS: dict[str, tuple[str, Callable[[NvmlBackend, int], object]]] = {
    "count": ("nvmlDeviceGetCount", lambda b, _i: b.device_count()),
    "uuid-handle": ("nvmlDeviceGetHandleByIndex", lambda b, i: b.uuid(i)),
    "uuid": ("nvmlDeviceGetUUID", lambda b, i: b.uuid(i)),
    "constraints": ("nvmlDeviceGetPowerManagementLimitConstraints", lambda b, i: b.constraints(i)),
    "constraints-default": (
        "nvmlDeviceGetPowerManagementDefaultLimit",
        lambda b, i: b.constraints(i),
    ),
    "processes": ("nvmlDeviceGetComputeRunningProcesses", lambda b, i: b.processes(i)),
}


@pytest.mark.parametrize("read", list(READS))
@pytest.mark.parametrize("error", CLASSIFIED, ids=CLASSIFIED_IDS)
def test_read_errors_are_classified(
    fake_nvml: FakeNvml,
    nvml_backend: NvmlBackend,
    read: str,
    error: tuple[str, int, GpuErrorClass],
) -> None:
    """A failing NVML read raises GpuError with the code's class and the code, chained."""
    name, code, error_class = error
    function, call = READS[read]
    device = None if read == "count" else 1
    fake_nvml.inject(function, device, name)
    with pytest.raises(GpuError) as info:
        call(nvml_backend, 1)
    assert info.value.error_class is error_class
    assert info.value.code == code
    cause = info.value.__cause__
    assert cause is not None
    assert type(cause).__module__ == "pynvml"
    if device is not None:
        call(nvml_backend, 0)  # the fault is on device 1 only


def test_unknown_code_keeps_its_number(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    """A code outside the table is UNKNOWN, and the number is still reported."""
    fake_nvml.inject("nvmlDeviceGetUUID", 0, 4242)
    with pytest.raises(GpuError) as info:
        nvml_backend.uuid(0)
    assert info.value.error_class is GpuErrorClass.UNKNOWN
    assert info.value.code == 4242


def test_fault_times_and_after(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    """A fault with after=1, times=1 fails only the second call."""
    fake_nvml.inject("nvmlDeviceGetUUID", 0, "NVML_ERROR_GPU_IS_LOST", times=1, after=1)
    assert nvml_backend.uuid(0) == DEFAULT_UUIDS[0]
    with pytest.raises(GpuError) as info:
        nvml_backend.uuid(0)
    assert info.value.error_class is GpuErrorClass.GPU_IS_LOST
    assert nvml_backend.uuid(0) == DEFAULT_UUIDS[0]


def test_undecodable_uuid_is_unknown_gpu_error(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend
) -> None:
    """Bytes the bindings cannot decode become GpuError(UNKNOWN, code=None), not a crash."""
    fake_nvml.configure_device(0, FakeDevice(uuid=b"GPU-\xff\xfe"))
    with pytest.raises(GpuError) as info:
        nvml_backend.uuid(0)
    assert info.value.error_class is GpuErrorClass.UNKNOWN
    assert info.value.code is None
    assert isinstance(info.value.__cause__, UnicodeDecodeError)
