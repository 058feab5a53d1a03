"""Pytest fixtures: the fake libnvidia-ml.so.1, built and verified, and an NvmlBackend on it.

A plugin module: tests/nvml/conftest.py imports these fixtures; other test
directories can do the same, or a root conftest can list this module in
``pytest_plugins``.

``LD_LIBRARY_PATH`` is read by glibc only at process start, so the test command
(``make test`` / ``make pytest``) exports it before pytest runs; these fixtures
build the library into that directory and refuse to go on unless the
``libnvidia-ml.so.1`` this process loads is exactly the file just built. That
also guarantees these tests never write power limits to a real GPU.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from capwatch.agent.nvml.backend import NvmlBackend
from tests.fakenvml.build import DEFAULT_OUTDIR, SONAME, build, build_id
from tests.fakenvml.control import FakeNvml

HOW_TO_RUN = (
    "run the NVML tests with `make test` (or `make pytest`), or by hand: "
    "`LD_LIBRARY_PATH=$PWD/build/fakenvml .venv/bin/pytest tests/nvml`"
)


def _mapped_path(name: str) -> Path | None:
    """The file named ``name`` that this process has mapped, if any."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and Path(fields[5]).name == name:
            return Path(fields[5])
    return None


@pytest.fixture(scope="session")
def fake_nvml_library() -> Path:
    """Build the fake into build/fakenvml and check it is what ``libnvidia-ml.so.1`` resolves to."""
    outdir = build(DEFAULT_OUTDIR)
    search = os.environ.get("LD_LIBRARY_PATH", "").split(":")
    if not any(entry and Path(entry).resolve() == outdir for entry in search):
        pytest.fail(f"LD_LIBRARY_PATH does not contain {outdir}; {HOW_TO_RUN}", pytrace=False)
    try:
        lib = ctypes.CDLL(SONAME)
    except OSError as exc:
        pytest.fail(f"cannot load {SONAME} ({exc}); {HOW_TO_RUN}", pytrace=False)
    if not hasattr(lib, "fakenvml_api_version"):
        pytest.fail(
            f"{SONAME} in this process is not the capwatch fake (a real NVIDIA driver?); "
            f"refusing to run; {HOW_TO_RUN}",
            pytrace=False,
        )
    lib.fakenvml_build_id.restype = ctypes.c_char_p
    loaded_id = lib.fakenvml_build_id().decode()
    mapped = _mapped_path(SONAME)
    if loaded_id != build_id(outdir) or mapped is None or mapped.resolve() != outdir / SONAME:
        pytest.fail(
            f"the {SONAME} loaded in this process ({mapped}, build {loaded_id[:12]}) is not "
            f"{outdir / SONAME} as just built (build {build_id(outdir)[:12]}): it was loaded "
            "before the rebuild or from another directory; rerun the tests",
            pytrace=False,
        )
    return outdir / SONAME


@pytest.fixture
def fake_nvml(fake_nvml_library: Path) -> Iterator[FakeNvml]:
    """The fake, reset to its defaults (2 devices, 100-400 W, default 300 W, no processes)."""
    fake = FakeNvml()
    fake.reset()
    yield fake
    fake.reset()


# Short event waits, so closing the backend after each test costs ~20 ms, not ~500.
FIXTURE_EVENT_WAIT_MS = 20


@pytest.fixture
def nvml_backend(fake_nvml: FakeNvml) -> Iterator[NvmlBackend]:
    """An NvmlBackend opened on the reset fake (short event waits), closed after the test."""
    backend = NvmlBackend.open(event_wait_ms=FIXTURE_EVENT_WAIT_MS)
    yield backend
    backend.close()
