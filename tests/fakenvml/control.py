"""Typed control of the fake ``libnvidia-ml.so.1`` from tests.

:class:`FakeNvml` wraps the library's ``fakenvml_*`` functions through ctypes.
``ctypes.CDLL("libnvidia-ml.so.1")`` returns the object already loaded by
``pynvml`` (same soname, same process), so what a test configures here is what
the real bindings see. :class:`FakeConfig` renders the file format that the
library reads from ``FAKE_NVML_CONFIG`` at ``nvmlInit``, for subprocesses.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

SONAME = "libnvidia-ml.so.1"
API_VERSION = 1
UUID_BUFFER = 96  # NVML_DEVICE_UUID_V2_BUFFER_SIZE

DEFAULT_UUIDS = tuple(f"GPU-fa4e0000-0000-4000-8000-{i:012x}" for i in range(2))
DEFAULT_MIN_MW = 100_000
DEFAULT_MAX_MW = 400_000
DEFAULT_LIMIT_MW = 300_000

ErrorSpec = str | int  # an nvmlReturn_t name ("NVML_ERROR_NO_PERMISSION") or number


@dataclass(frozen=True, kw_only=True)
class FakeDevice:
    """One fake GPU. ``current_milliwatts`` defaults to the default limit.

    ``uuid`` may be raw bytes, to hand the bindings a UUID that is not valid text.
    """

    uuid: str | bytes
    min_milliwatts: int = DEFAULT_MIN_MW
    max_milliwatts: int = DEFAULT_MAX_MW
    default_milliwatts: int = DEFAULT_LIMIT_MW
    current_milliwatts: int | None = None
    pids: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Fault:
    """A fault rule; ``device=None`` matches any device (and device-less calls)."""

    function: str
    device: int | None = None
    error: ErrorSpec = "NVML_SUCCESS"
    times: int | None = None  # None: every matching call
    after: int = 0  # matching calls let through first
    hang_seconds: float = 0.0


@dataclass(frozen=True, kw_only=True)
class UuidChange:
    """After ``after_calls`` more GetUUID calls on ``index``, its UUID becomes ``new_uuid``."""

    index: int
    new_uuid: str
    after_calls: int = 0


@dataclass(frozen=True, kw_only=True)
class WriteLogEntry:
    """One nvmlDeviceSetPowerManagementLimit call that reached the library."""

    device: int
    uuid: str
    milliwatts: int
    rc: int


@dataclass(frozen=True, kw_only=True)
class FakeConfig:
    """The contents of a ``FAKE_NVML_CONFIG`` file (see tests/fakenvml/README.md)."""

    devices: tuple[FakeDevice, ...] | None = None  # None: the library's defaults
    faults: tuple[Fault, ...] = ()
    uuid_changes: tuple[UuidChange, ...] = ()
    init_error: ErrorSpec | None = None
    log_file: Path | None = None
    extra_lines: tuple[str, ...] = ()

    def render(self) -> str:
        """The file text."""
        lines = ["# capwatch fake NVML configuration"]
        if self.devices is not None:
            lines.append(f"devices {len(self.devices)}")
            for i, dev in enumerate(self.devices):
                current = dev.current_milliwatts
                uuid = dev.uuid.decode() if isinstance(dev.uuid, bytes) else dev.uuid
                lines.append(
                    f"device {i} uuid={uuid} min={dev.min_milliwatts} "
                    f"max={dev.max_milliwatts} default={dev.default_milliwatts} "
                    f"current={dev.default_milliwatts if current is None else current}"
                )
                lines.append(" ".join(["processes", str(i), *map(str, dev.pids)]))
        for f in self.faults:
            device = "*" if f.device is None else str(f.device)
            line = f"fault {f.function} {device} {f.error} after={f.after} hang={f.hang_seconds}"
            if f.times is not None:
                line += f" times={f.times}"
            lines.append(line)
        lines.extend(
            f"uuid_change {c.index} {c.after_calls} {c.new_uuid}" for c in self.uuid_changes
        )
        if self.init_error is not None:
            lines.append(f"init_error {self.init_error}")
        if self.log_file is not None:
            lines.append(f"log_file {self.log_file}")
        lines.extend(self.extra_lines)
        return "\n".join(lines) + "\n"

    def write(self, path: Path) -> Path:
        """Write the file; returns ``path`` (for ``FAKE_NVML_CONFIG``)."""
        path.write_text(self.render())
        return path


_LOG_LINE = re.compile(r"set_limit device=(-?\d+) uuid=(\S+) milliwatts=(\d+) rc=(\d+)")


def read_log_file(path: Path) -> list[WriteLogEntry]:
    """Parse the ``log_file`` a subprocess's fake library appended to."""
    entries = []
    for line in path.read_text().splitlines():
        m = _LOG_LINE.fullmatch(line)
        if m is None:
            raise ValueError(f"{path}: unexpected log line {line!r}")
        entries.append(
            WriteLogEntry(
                device=int(m[1]),
                uuid="" if m[2] == "-" else m[2],
                milliwatts=int(m[3]),
                rc=int(m[4]),
            )
        )
    return entries


def _declare(lib: ctypes.CDLL) -> None:
    c = ctypes
    signatures: dict[str, tuple[object, list[object]]] = {
        "fakenvml_api_version": (c.c_int, []),
        "fakenvml_reset": (None, []),
        "fakenvml_set_device_count": (c.c_int, [c.c_uint]),
        "fakenvml_configure_device": (
            c.c_int,
            [c.c_uint, c.c_char_p, c.c_uint, c.c_uint, c.c_uint, c.c_uint],
        ),
        "fakenvml_set_processes": (c.c_int, [c.c_uint, c.POINTER(c.c_uint), c.c_uint]),
        "fakenvml_inject": (
            c.c_int,
            [c.c_char_p, c.c_int, c.c_int, c.c_long, c.c_long, c.c_double],
        ),
        "fakenvml_clear_faults": (None, []),
        "fakenvml_change_uuid": (c.c_int, [c.c_uint, c.c_uint, c.c_char_p]),
        "fakenvml_return_code": (c.c_int, [c.c_char_p]),
        "fakenvml_write_log_count": (c.c_uint, []),
        "fakenvml_write_log_entry": (
            c.c_int,
            [
                c.c_uint,
                c.POINTER(c.c_int),
                c.POINTER(c.c_uint),
                c.POINTER(c.c_int),
                c.c_char_p,
                c.c_uint,
            ],
        ),
        "fakenvml_limit": (c.c_long, [c.c_uint]),
        "fakenvml_device_uuid": (c.c_int, [c.c_uint, c.c_char_p, c.c_uint]),
        "fakenvml_call_count": (c.c_long, [c.c_char_p, c.c_int]),
        "fakenvml_init_count": (c.c_int, []),
        "fakenvml_load_config": (c.c_int, [c.c_char_p]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


class FakeNvml:
    """The fake library's control API, on the ``libnvidia-ml.so.1`` this process loaded."""

    def __init__(self, lib: ctypes.CDLL | None = None) -> None:
        self._lib = lib if lib is not None else ctypes.CDLL(SONAME)
        if not hasattr(self._lib, "fakenvml_api_version"):
            raise RuntimeError(f"{SONAME} loaded in this process is not the capwatch fake")
        _declare(self._lib)
        version = self._lib.fakenvml_api_version()
        if version != API_VERSION:
            raise RuntimeError(f"fake NVML API version {version}, expected {API_VERSION}")

    # -- state ------------------------------------------------------------

    def reset(self) -> None:
        """Back to the defaults: 2 devices, no faults, empty logs, not initialised."""
        self._lib.fakenvml_reset()

    def set_device_count(self, count: int) -> None:
        self._check(self._lib.fakenvml_set_device_count(count), f"device count {count}")

    def configure_device(self, index: int, device: FakeDevice) -> None:
        """Set one device (extends the count to ``index + 1`` if needed)."""
        current = device.current_milliwatts
        rc = self._lib.fakenvml_configure_device(
            index,
            device.uuid.encode() if isinstance(device.uuid, str) else device.uuid,
            device.min_milliwatts,
            device.max_milliwatts,
            device.default_milliwatts,
            device.default_milliwatts if current is None else current,
        )
        self._check(rc, f"configure device {index}")
        self.set_processes(index, device.pids)

    def configure(self, devices: Sequence[FakeDevice]) -> None:
        """Replace the whole device table."""
        self.set_device_count(0)
        for index, device in enumerate(devices):
            self.configure_device(index, device)

    def set_processes(self, index: int, pids: Iterable[int]) -> None:
        values = list(pids)
        array = (ctypes.c_uint * max(len(values), 1))(*values)
        self._check(
            self._lib.fakenvml_set_processes(index, array, len(values)), f"processes {index}"
        )

    # -- faults -----------------------------------------------------------

    def inject(
        self,
        function: str,
        device: int | None,
        error: ErrorSpec,
        times: int | None = None,
        *,
        after: int = 0,
    ) -> None:
        """Calls of ``function`` on ``device`` (None: any) return ``error``."""
        self.add_fault(
            Fault(function=function, device=device, error=error, times=times, after=after)
        )

    def inject_hang(
        self,
        function: str,
        device: int | None,
        seconds: float,
        *,
        error: ErrorSpec = "NVML_SUCCESS",
        times: int | None = None,
        after: int = 0,
    ) -> None:
        """Calls sleep ``seconds``, then fail with ``error`` or (by default) proceed."""
        self.add_fault(
            Fault(
                function=function,
                device=device,
                error=error,
                times=times,
                after=after,
                hang_seconds=seconds,
            )
        )

    def fail_init(self, error: ErrorSpec, times: int | None = None) -> None:
        self.inject("nvmlInit", None, error, times)

    def add_fault(self, fault: Fault) -> None:
        rc = self._lib.fakenvml_inject(
            fault.function.encode(),
            -1 if fault.device is None else fault.device,
            self.return_code(fault.error),
            -1 if fault.times is None else fault.times,
            fault.after,
            fault.hang_seconds,
        )
        self._check(rc, f"inject {fault}")

    def clear_faults(self) -> None:
        """Drop every fault and pending UUID change; devices, limits and logs stay."""
        self._lib.fakenvml_clear_faults()

    def change_uuid(self, index: int, new_uuid: str, *, after_calls: int = 0) -> None:
        """After ``after_calls`` more GetUUID calls on ``index``, it reports ``new_uuid``."""
        rc = self._lib.fakenvml_change_uuid(index, after_calls, new_uuid.encode())
        self._check(rc, f"change uuid {index}")

    def load_config(self, path: Path) -> None:
        rc = self._lib.fakenvml_load_config(str(path).encode())
        if rc != 0:
            where = "unreadable" if rc < 0 else f"line {rc} invalid"
            raise ValueError(f"fake NVML config {path}: {where}")

    # -- observations -----------------------------------------------------

    def return_code(self, error: ErrorSpec) -> int:
        """The numeric nvmlReturn_t for a name, as the official header defines it."""
        if isinstance(error, int):
            return error
        code = int(self._lib.fakenvml_return_code(error.encode()))
        if code < 0:
            raise ValueError(f"unknown NVML return code {error!r}")
        return code

    def write_log(self) -> list[WriteLogEntry]:
        """Every set-limit call that reached the library, in order, failed or not."""
        entries = []
        for i in range(self._lib.fakenvml_write_log_count()):
            device, mw, rc = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
            uuid = ctypes.create_string_buffer(UUID_BUFFER)
            self._check(
                self._lib.fakenvml_write_log_entry(
                    i, ctypes.byref(device), ctypes.byref(mw), ctypes.byref(rc), uuid, UUID_BUFFER
                ),
                f"write log entry {i}",
            )
            entries.append(
                WriteLogEntry(
                    device=device.value,
                    uuid=uuid.value.decode(),
                    milliwatts=mw.value,
                    rc=rc.value,
                )
            )
        return entries

    def limit(self, index: int) -> int:
        """The device's current power limit in milliwatts."""
        mw = int(self._lib.fakenvml_limit(index))
        if mw < 0:
            raise IndexError(f"no fake device {index}")
        return mw

    def device_uuid(self, index: int) -> str:
        """The device's UUID now (does not count as an nvmlDeviceGetUUID call)."""
        buf = ctypes.create_string_buffer(UUID_BUFFER)
        self._check(self._lib.fakenvml_device_uuid(index, buf, UUID_BUFFER), f"uuid {index}")
        return buf.value.decode()

    def call_count(self, function: str, device: int | None = None) -> int:
        """Calls of ``function`` so far, on ``device`` or on all (None)."""
        n = int(self._lib.fakenvml_call_count(function.encode(), -1 if device is None else device))
        if n < 0:
            raise ValueError(f"unknown function {function!r}")
        return n

    def init_count(self) -> int:
        """nvmlInit calls not yet matched by nvmlShutdown."""
        return int(self._lib.fakenvml_init_count())

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc != 0:
            raise ValueError(f"fake NVML rejected {what}")
