"""The fake libnvidia-ml.so.1 itself: its build, its exports and its config file."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from capwatch.agent.gpus import GpuError, GpuErrorClass, WriteOutcome
from capwatch.agent.nvml.backend import NvmlBackend
from capwatch.kit.errors import BackendUnavailable
from tests.fakenvml.build import HERE, SONAME, BuildError, build, find_header
from tests.fakenvml.control import (
    DEFAULT_UUIDS,
    FakeConfig,
    FakeDevice,
    FakeNvml,
    Fault,
    UuidChange,
    WriteLogEntry,
    read_limits_file,
    read_log_file,
)

pytestmark = pytest.mark.nvml

REPO_ROOT = Path(__file__).resolve().parents[2]

# The C symbols pynvml's wrappers look up on the paths agent.nvml.backend uses.
PYNVML_SYMBOLS = {
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetPowerManagementLimitConstraints",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceSetPowerManagementLimit",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    # readings() and the event thread
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
}


def _exports(library: Path) -> set[str]:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True
    ).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def test_compiles_with_werror_against_official_header(tmp_path: Path) -> None:
    """A fresh build with -Wall -Wextra -Werror against nvidia-nvml-dev's nvml.h succeeds,
    with the soname pynvml loads and every symbol it needs exported."""
    header = find_header()
    assert header.parent.name == "include"
    assert "nvidia" in header.parts
    library = build(tmp_path, force=True) / SONAME
    dynamic = subprocess.run(
        ["readelf", "-d", str(library)], capture_output=True, text=True, check=True
    ).stdout
    assert f"Library soname: [{SONAME}]" in dynamic
    exports = _exports(library)
    assert exports >= PYNVML_SYMBOLS
    assert "fakenvml_inject" in exports
    # Internal state and helpers stay hidden: only NVML and the control API.
    assert {name for name in exports if not name.startswith(("nvml", "fakenvml_"))} == set()


def _copy_sources(to: Path) -> Path:
    to.mkdir()
    for path in [*HERE.glob("*.c"), *HERE.glob("*.h")]:
        (to / path.name).write_text(path.read_text())
    return to


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("int fakenvml_bad(void) { int unused; return 0; }", "unused"),
        # An entry point nvml.h does not declare (here: a typo) must not build.
        ("nvmlReturn_t nvmlDeviceGetUUIDD(void) { return NVML_SUCCESS; }", "no previous prototype"),
    ],
    ids=["unused-variable", "undeclared-entry-point"],
)
def test_warnings_are_errors(tmp_path: Path, code: str, message: str) -> None:
    """The build really fails on warnings, including an NVML symbol nvml.h does not declare."""
    src = _copy_sources(tmp_path / "src")
    (src / "bad.c").write_text(f'#include "fake_nvml.h"\nint fakenvml_bad(void);\n{code}\n')
    with pytest.raises(BuildError, match=message):
        build(tmp_path / "out", source_dir=src)


def test_rebuilds_only_when_a_source_changes(tmp_path: Path) -> None:
    """Unchanged sources are not recompiled; an edited source or header is."""
    src = _copy_sources(tmp_path / "src")
    library = build(tmp_path / "out", source_dir=src) / SONAME
    first = library.stat().st_ino
    build(tmp_path / "out", source_dir=src)
    assert library.stat().st_ino == first
    header = src / "fake_nvml.h"
    header.write_text(header.read_text() + "\n/* edited */\n")
    build(tmp_path / "out", source_dir=src)
    second = library.stat().st_ino
    assert second != first
    (src / "fake_nvml.c").write_text((src / "fake_nvml.c").read_text() + "\n/* edited */\n")
    build(tmp_path / "out", source_dir=src)
    assert library.stat().st_ino != second


def test_build_script_prints_the_directory(tmp_path: Path) -> None:
    """`python tests/fakenvml/build.py OUTDIR` builds there and prints the directory."""
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tests/fakenvml/build.py"), str(tmp_path / "lib")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str((tmp_path / "lib").resolve())
    assert (tmp_path / "lib" / SONAME).is_file()


def test_unknown_function_or_code_is_rejected(fake_nvml: FakeNvml) -> None:
    """The control API refuses faults it could never apply, instead of ignoring them."""
    with pytest.raises(ValueError, match="nvmlDeviceGetNmae"):
        fake_nvml.inject("nvmlDeviceGetNmae", 0, "NVML_ERROR_NOT_FOUND")
    with pytest.raises(ValueError, match="NVML_ERROR_NOPE"):
        fake_nvml.inject("nvmlDeviceGetUUID", 0, "NVML_ERROR_NOPE")


def test_config_file_is_applied_at_init(
    fake_nvml: FakeNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FAKE_NVML_CONFIG sets devices, processes, faults and UUID changes at nvmlInit."""
    config = FakeConfig(
        devices=(
            FakeDevice(uuid="GPU-1111", pids=(100, 101)),
            FakeDevice(uuid="GPU-2222", max_milliwatts=600_000, default_milliwatts=450_000),
            FakeDevice(uuid="GPU-3333"),
        ),
        faults=(Fault(function="nvmlDeviceSetPowerManagementLimit", device=2, error="IN_USE"),),
        uuid_changes=(UuidChange(index=1, new_uuid="GPU-9999", after_calls=1),),
    )
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(config.write(tmp_path / "fake.conf")))
    fake_nvml.reset()
    with NvmlBackend() as backend:
        assert backend.device_count() == 3
        assert backend.processes(0) == (100, 101)
        assert backend.constraints(1).default_milliwatts == 450_000
        assert backend.set_limit(2, uuid="GPU-3333", milliwatts=200_000).error_class is (
            GpuErrorClass.IN_USE
        )
        step_uuid = backend.uuid(1)
        assert step_uuid == "GPU-2222"
        result = backend.set_limit(1, uuid=step_uuid, milliwatts=200_000)
        assert result.outcome is WriteOutcome.IDENTITY_MISMATCH
    assert [e.device for e in fake_nvml.write_log()] == [2]


def test_config_init_error(
    fake_nvml: FakeNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """init_error in the file makes nvmlInit fail with that code."""
    path = FakeConfig(init_error="NVML_ERROR_DRIVER_NOT_LOADED").write(tmp_path / "fake.conf")
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(path))
    fake_nvml.reset()
    with pytest.raises(BackendUnavailable, match="driver_not_loaded"):
        NvmlBackend()


def test_malformed_config_fails_loudly(
    fake_nvml: FakeNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bad line makes init fail (UNKNOWN) rather than run with half a configuration."""
    path = tmp_path / "fake.conf"
    path.write_text("devices 2\ndevice 0 uuid=GPU-x watts=5\n")
    with pytest.raises(ValueError, match="line 2"):
        fake_nvml.load_config(path)
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(path))
    fake_nvml.reset()
    with pytest.raises(BackendUnavailable, match="error_class=unknown"):
        NvmlBackend()


def test_subprocess_configured_by_file(fake_nvml_library: Path, tmp_path: Path) -> None:
    """A separate process (like the capwatch CLI) is configured by the file and its
    writes are visible in log_file."""
    log = tmp_path / "writes.log"
    config = FakeConfig(
        devices=(FakeDevice(uuid="GPU-sub0", pids=(31337,)),),
        faults=(Fault(function="nvmlDeviceGetUUID", device=0, error="GPU_IS_LOST", after=2),),
        log_file=log,
    ).write(tmp_path / "fake.conf")
    script = textwrap.dedent(
        """
        from capwatch.agent.gpus import GpuError
        from capwatch.agent.nvml.backend import NvmlBackend
        with NvmlBackend() as b:
            print(b.device_count(), b.uuid(0), b.processes(0))
            print(b.set_limit(0, uuid="GPU-sub0", milliwatts=123_000).outcome.value)
            try:
                b.uuid(0)
            except GpuError as e:
                print(e.error_class.value)
        """
    )
    env = {**os.environ, "FAKE_NVML_CONFIG": str(config)}
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        check=False,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:3] == ["1 GPU-sub0 (31337,)", "ok", "gpu_is_lost"]
    assert read_log_file(log) == [
        WriteLogEntry(device=0, uuid="GPU-sub0", milliwatts=123_000, rc=0)
    ]


def test_limits_file_keeps_the_limits_between_processes(
    fake_nvml: FakeNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With limits_file, a limit set outlives the process that set it, as a GPU's does:
    the next process starts with it (an agent restarted finds its caps in place), a
    failed write changes nothing, and a device the file does not list keeps its own."""
    limits = tmp_path / "limits"
    config = FakeConfig(
        devices=(FakeDevice(uuid="GPU-lim0"), FakeDevice(uuid="GPU-lim1")),
        faults=(
            Fault(function="nvmlDeviceSetPowerManagementLimit", device=1, error="NO_PERMISSION"),
        ),
        limits_file=limits,
    ).write(tmp_path / "fake.conf")
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(config))
    fake_nvml.reset()
    with NvmlBackend() as backend:
        assert backend.set_limit(0, uuid="GPU-lim0", milliwatts=250_000).ok
        assert not backend.set_limit(1, uuid="GPU-lim1", milliwatts=200_000).ok
    assert read_limits_file(limits) == {"GPU-lim0": 250_000, "GPU-lim1": 300_000}
    fake_nvml.reset()  # a new process: nothing in memory, the file as it was left
    with NvmlBackend() as backend:
        assert fake_nvml.limit(0) == 250_000
        assert fake_nvml.limit(1) == 300_000
    assert not list(tmp_path.glob("limits.tmp"))


def test_count_fault(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    """A device-count fault (no device) fails the count read only."""
    fake_nvml.inject("nvmlDeviceGetCount_v2", None, "NVML_ERROR_UNKNOWN", times=1)
    with pytest.raises(GpuError):
        nvml_backend.device_count()
    assert nvml_backend.device_count() == 2


def test_clear_faults_keeps_devices(fake_nvml: FakeNvml, nvml_backend: NvmlBackend) -> None:
    """clear_faults drops faults and pending UUID changes but keeps the device state."""
    assert nvml_backend.set_limit(0, uuid=DEFAULT_UUIDS[0], milliwatts=222_000).ok
    fake_nvml.inject("nvmlDeviceGetUUID", 0, "NVML_ERROR_GPU_IS_LOST")
    fake_nvml.change_uuid(1, "GPU-elsewhere")
    fake_nvml.clear_faults()
    assert nvml_backend.uuid(0) == DEFAULT_UUIDS[0]
    assert nvml_backend.uuid(1) == DEFAULT_UUIDS[1]
    assert fake_nvml.limit(0) == 222_000
    assert len(fake_nvml.write_log()) == 1


def test_readme_config_example_parses(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    """The configuration example in tests/fakenvml/README.md is valid and does what it says."""
    readme = (HERE / "README.md").read_text()
    section = readme[readme.index("## Configuration file") :]
    example = section.split("```")[1].removeprefix("\n")
    path = tmp_path / "example.conf"
    path.write_text(example.replace("/tmp/writes.log", str(tmp_path / "writes.log")))
    fake_nvml.load_config(path)
    with pytest.raises(BackendUnavailable, match="driver_not_loaded"):
        NvmlBackend()  # the example's init_error
    assert fake_nvml.device_uuid(0) == "GPU-aaaa"
    assert fake_nvml.limit(2) == 300_000
    with pytest.raises(IndexError):
        fake_nvml.limit(3)
    assert (tmp_path / "writes.log").is_file()
