"""Typed control of the fake ``libnvidia-ml.so.1`` from tests.

:class:`FakeNvml` wraps the library's ``fakenvml_*`` functions through ctypes.
``ctypes.CDLL("libnvidia-ml.so.1")`` returns the object already loaded by
``pynvml`` (same soname, same process), so what a test configures here is what
the real bindings see. :class:`FakeConfig` renders the file format that the
library reads from ``FAKE_NVML_CONFIG`` at ``nvmlInit``, for subprocesses.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Sequence
from pathlib import Path

from tests.fakenvml.values import (
    DEFAULT_DRAW_MW,
    DEFAULT_EVENT_TYPES,
    DEFAULT_LIMIT_MW,
    DEFAULT_MAX_MW,
    DEFAULT_MIN_MW,
    DEFAULT_UUIDS,
    EVENT_DOUBLE_BIT_ECC,
    EVENT_SINGLE_BIT_ECC,
    EVENT_XID,
    MAX_QUEUED_EVENTS,
    ErrorSpec,
    FakeConfig,
    FakeDevice,
    Fault,
    QueuedEvent,
    UuidChange,
    WriteLogEntry,
    read_limits_file,
    read_log_file,
)

# The values live in tests.fakenvml.values; tests import them from here too.
__all__ = [
    "API_VERSION",
    "DEFAULT_DRAW_MW",
    "DEFAULT_EVENT_TYPES",
    "DEFAULT_LIMIT_MW",
    "DEFAULT_MAX_MW",
    "DEFAULT_MIN_MW",
    "DEFAULT_UUIDS",
    "EVENT_DOUBLE_BIT_ECC",
    "EVENT_SINGLE_BIT_ECC",
    "EVENT_XID",
    "MAX_QUEUED_EVENTS",
    "SONAME",
    "ErrorSpec",
    "FakeConfig",
    "FakeDevice",
    "FakeNvml",
    "Fault",
    "QueuedEvent",
    "UuidChange",
    "WriteLogEntry",
    "read_limits_file",
    "read_log_file",
]

SONAME = "libnvidia-ml.so.1"
API_VERSION = 2
UUID_BUFFER = 96  # NVML_DEVICE_UUID_V2_BUFFER_SIZE


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
        "fakenvml_set_power_draw": (c.c_int, [c.c_uint, c.c_uint]),
        "fakenvml_set_enforced_limit": (c.c_int, [c.c_uint, c.c_long]),
        "fakenvml_set_clocks_event_reasons": (c.c_int, [c.c_uint, c.c_ulonglong]),
        "fakenvml_set_ecc_errors": (c.c_int, [c.c_uint, c.c_ulonglong]),
        "fakenvml_add_ecc_errors": (c.c_int, [c.c_uint, c.c_ulonglong, c.c_int]),
        "fakenvml_set_row_remap": (c.c_int, [c.c_uint, c.c_int, c.c_int]),
        "fakenvml_set_older_part": (c.c_int, [c.c_uint, c.c_int, c.c_int]),
        "fakenvml_set_lost": (c.c_int, [c.c_uint, c.c_int]),
        "fakenvml_set_supported_events": (c.c_int, [c.c_uint, c.c_ulonglong]),
        "fakenvml_queue_event": (c.c_int, [c.c_uint, c.c_ulonglong, c.c_ulonglong, c.c_uint]),
        "fakenvml_pending_events": (c.c_uint, []),
        "fakenvml_dropped_events": (c.c_ulong, []),
        "fakenvml_registered_events": (c.c_ulonglong, [c.c_uint]),
        "fakenvml_event_sets": (c.c_int, []),
        "fakenvml_event_waiters": (c.c_int, []),
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
        self.set_power_draw(index, device.power_draw_milliwatts)
        self.set_enforced_limit(index, device.enforced_milliwatts)
        self.set_clocks_event_reasons(index, device.clocks_event_reasons)
        self.set_ecc_errors(index, device.ecc_uncorrected_volatile)
        self.set_row_remap(
            index, pending=device.row_remap_pending, failure=device.row_remap_failure
        )
        self.set_older_part(
            index, older_part=device.older_part, retired_pending=device.retired_pages_pending
        )
        self.set_supported_events(index, device.supported_events)
        self.set_lost(index, device.lost)

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

    # -- health -----------------------------------------------------------

    def set_power_draw(self, index: int, milliwatts: int) -> None:
        """What nvmlDeviceGetPowerUsage answers."""
        self._check(self._lib.fakenvml_set_power_draw(index, milliwatts), f"draw {index}")

    def set_enforced_limit(self, index: int, milliwatts: int | None) -> None:
        """What nvmlDeviceGetEnforcedPowerLimit answers; None: the current limit (default)."""
        rc = self._lib.fakenvml_set_enforced_limit(index, -1 if milliwatts is None else milliwatts)
        self._check(rc, f"enforced limit {index}")

    def set_clocks_event_reasons(self, index: int, mask: int) -> None:
        """The nvmlClocksEventReason* mask nvmlDeviceGetCurrentClocksEventReasons answers."""
        rc = self._lib.fakenvml_set_clocks_event_reasons(index, mask)
        self._check(rc, f"clocks event reasons {index}")

    def set_ecc_errors(self, index: int, count: int) -> None:
        """The volatile uncorrected ECC count."""
        self._check(self._lib.fakenvml_set_ecc_errors(index, count), f"ecc {index}")

    def add_ecc_errors(self, index: int, count: int = 1, *, with_event: bool = False) -> None:
        """Bump the volatile uncorrected ECC count; ``with_event`` also queues a DBE event."""
        rc = self._lib.fakenvml_add_ecc_errors(index, count, int(with_event))
        self._check(rc, f"add ecc {index}")

    def set_row_remap(self, index: int, *, pending: bool, failure: bool) -> None:
        """What nvmlDeviceGetRemappedRows reports as pending and failed."""
        rc = self._lib.fakenvml_set_row_remap(index, int(pending), int(failure))
        self._check(rc, f"row remap {index}")

    def set_older_part(
        self, index: int, *, older_part: bool, retired_pending: bool = False
    ) -> None:
        """An older part: nvmlDeviceGetRemappedRows is NOT_SUPPORTED and
        nvmlDeviceGetRetiredPagesPendingStatus answers ``retired_pending``."""
        rc = self._lib.fakenvml_set_older_part(index, int(older_part), int(retired_pending))
        self._check(rc, f"older part {index}")

    def set_lost(self, index: int, lost: bool = True) -> None:
        """Lose the GPU (every call naming it: GPU_IS_LOST) or restore it, same UUID."""
        self._check(self._lib.fakenvml_set_lost(index, int(lost)), f"lost {index}")

    def set_supported_events(self, index: int, mask: int) -> None:
        """What nvmlDeviceGetSupportedEventTypes answers; registering others: NOT_SUPPORTED."""
        rc = self._lib.fakenvml_set_supported_events(index, mask)
        self._check(rc, f"supported events {index}")

    # -- events -----------------------------------------------------------

    def queue_event(self, event: QueuedEvent) -> int:
        """Queue ``event.count`` events; returns how many fitted (the rest are dropped)."""
        n = int(
            self._lib.fakenvml_queue_event(event.index, event.event_type, event.data, event.count)
        )
        if n < 0:
            raise ValueError(f"fake NVML rejected {event}")
        return n

    def queue_xid(self, index: int, code: int, count: int = 1) -> int:
        """Queue ``count`` XID ``code`` events on device ``index``."""
        return self.queue_event(QueuedEvent(index=index, data=code, count=count))

    def pending_events(self) -> int:
        """Queued events no wait has taken yet."""
        return int(self._lib.fakenvml_pending_events())

    def dropped_events(self) -> int:
        """Events dropped because the queue was full."""
        return int(self._lib.fakenvml_dropped_events())

    def registered_events(self, index: int) -> int:
        """The event types registered for device ``index``, over every live event set."""
        return int(self._lib.fakenvml_registered_events(index))

    def event_sets(self) -> int:
        """Event sets created and not yet freed."""
        return int(self._lib.fakenvml_event_sets())

    def event_waiters(self) -> int:
        """Threads blocked in nvmlEventSetWait_v2 now."""
        return int(self._lib.fakenvml_event_waiters())

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
