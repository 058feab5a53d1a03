"""NvmlBackend init, close and threads: BackendUnavailable, idempotent close, hangs."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from capwatch.agent.gpus import GpuError, GpuErrorClass, WriteOutcome
from capwatch.agent.nvml.backend import NvmlBackend
from capwatch.kit.errors import BackendUnavailable
from tests.fakenvml.control import DEFAULT_UUIDS, FakeNvml

pytestmark = pytest.mark.nvml

HANG_S = 0.3


@pytest.mark.parametrize(
    ("error", "code", "error_class"),
    [
        ("NVML_ERROR_LIBRARY_NOT_FOUND", 12, GpuErrorClass.LIBRARY_NOT_FOUND),
        ("NVML_ERROR_DRIVER_NOT_LOADED", 9, GpuErrorClass.DRIVER_NOT_LOADED),
        ("NVML_ERROR_NO_PERMISSION", 4, GpuErrorClass.NO_PERMISSION),
        ("NVML_ERROR_UNKNOWN", 999, GpuErrorClass.UNKNOWN),
    ],
)
def test_init_failure_is_backend_unavailable(
    fake_nvml: FakeNvml, error: str, code: int, error_class: GpuErrorClass
) -> None:
    """A failing nvmlInit raises BackendUnavailable naming the class, chained to the NVMLError."""
    fake_nvml.fail_init(error)
    with pytest.raises(BackendUnavailable) as info:
        NvmlBackend.open()
    assert f"error_class={error_class.value}" in str(info.value)
    assert f"code={code}" in str(info.value)
    assert getattr(info.value.__cause__, "value", None) == code
    assert fake_nvml.init_count() == 0


def test_init_recovers_after_transient_failure(fake_nvml: FakeNvml) -> None:
    """Once the library initialises again, a new backend opens and works."""
    fake_nvml.fail_init("NVML_ERROR_DRIVER_NOT_LOADED", times=1)
    with pytest.raises(BackendUnavailable):
        NvmlBackend()
    with NvmlBackend() as backend:
        assert backend.device_count() == 2
    assert fake_nvml.init_count() == 0


def test_close_is_idempotent(fake_nvml: FakeNvml) -> None:
    """close() calls nvmlShutdown exactly once, however often it is called."""
    backend = NvmlBackend.open()
    assert fake_nvml.init_count() == 1
    backend.close()
    backend.close()
    assert fake_nvml.init_count() == 0
    assert fake_nvml.call_count("nvmlShutdown") == 1


def test_concurrent_close_shuts_down_once(fake_nvml: FakeNvml) -> None:
    """Several threads closing at once still give a single nvmlShutdown."""
    backend = NvmlBackend.open()
    start = threading.Barrier(8)

    def close() -> None:
        start.wait()
        backend.close()

    threads = [threading.Thread(target=close) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert fake_nvml.call_count("nvmlShutdown") == 1
    assert fake_nvml.init_count() == 0


def test_shutdown_error_is_logged_not_raised(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    """A failing nvmlShutdown is logged with its class; close() returns normally."""
    backend = NvmlBackend.open()
    fake_nvml.inject("nvmlShutdown", None, "NVML_ERROR_GPU_IS_LOST")
    with caplog.at_level(logging.WARNING, logger="capwatch.agent.nvml.backend"):
        backend.close()
        backend.close()
    assert "error_class=gpu_is_lost" in caplog.text
    assert fake_nvml.call_count("nvmlShutdown") == 1


def test_closed_backend_does_not_call_nvml(fake_nvml: FakeNvml) -> None:
    """After close, reads raise UNINITIALIZED and writes fail, without touching the library."""
    backend = NvmlBackend.open()
    backend.close()
    with pytest.raises(GpuError) as info:
        backend.uuid(0)
    assert info.value.error_class is GpuErrorClass.UNINITIALIZED
    result = backend.set_limit(0, uuid=DEFAULT_UUIDS[0], milliwatts=200_000)
    assert result.outcome is WriteOutcome.FAILED
    assert result.error_class is GpuErrorClass.UNINITIALIZED
    assert fake_nvml.call_count("nvmlDeviceGetUUID") == 0
    assert fake_nvml.write_log() == []


def test_two_backends_share_the_library(fake_nvml: FakeNvml) -> None:
    """NVML is reference counted: closing one backend leaves another one working."""
    first, second = NvmlBackend(), NvmlBackend()
    assert fake_nvml.init_count() == 2
    first.close()
    assert second.uuid(1) == DEFAULT_UUIDS[1]
    second.close()
    assert fake_nvml.init_count() == 0


def test_hang_blocks_the_call(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    """A hung NVML call really blocks its caller for the hang, then completes."""
    fake_nvml.inject_hang("nvmlDeviceSetPowerManagementLimit", 0, HANG_S, times=1)
    start = time.monotonic()
    result = nvml_backend.set_limit(0, uuid=DEFAULT_UUIDS[0], milliwatts=200_000)
    assert time.monotonic() - start >= HANG_S
    assert result.ok
    assert fake_nvml.limit(0) == 200_000


def test_hang_then_error(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    """A hang may end in an error (e.g. TIMEOUT), which is classified as usual."""
    fake_nvml.inject_hang("nvmlDeviceGetUUID", 1, HANG_S, error="NVML_ERROR_TIMEOUT", times=1)
    start = time.monotonic()
    with pytest.raises(GpuError) as info:
        nvml_backend.uuid(1)
    assert time.monotonic() - start >= HANG_S
    assert info.value.error_class is GpuErrorClass.TIMEOUT


def test_hang_on_one_device_does_not_block_another(
    fake_nvml: FakeNvml, nvml_backend: NvmlBackend
) -> None:
    """While one thread is stuck in a call on device 0, another thread's calls on device 1
    complete: the fake sleeps outside its mutex and the backend holds no lock across calls."""
    fake_nvml.inject_hang("nvmlDeviceGetPowerManagementLimitConstraints", 0, HANG_S, times=1)
    done = threading.Event()

    def stuck() -> None:
        nvml_backend.constraints(0)
        done.set()

    thread = threading.Thread(target=stuck)
    thread.start()
    deadline = time.monotonic() + 5
    while fake_nvml.call_count("nvmlDeviceGetPowerManagementLimitConstraints", 0) == 0:
        assert time.monotonic() < deadline, "the hung call never started"
        time.sleep(0.005)
    assert nvml_backend.constraints(1).default_milliwatts == 300_000
    assert nvml_backend.set_limit(1, uuid=DEFAULT_UUIDS[1], milliwatts=200_000).ok
    assert not done.is_set(), "device 1 calls waited for the hung device 0 call"
    thread.join(5)
    assert done.is_set()
