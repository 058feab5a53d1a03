"""The real GPU backend: NVML through the official ``pynvml`` bindings (nvidia-ml-py).

This is the only module in capwatch that imports ``pynvml``. It turns every
NVML error into a :class:`~capwatch.agent.gpus.GpuErrorClass` by its numeric code
(:func:`classify`), raises :class:`~capwatch.agent.gpus.GpuError` on reads, and returns a
typed :class:`~capwatch.agent.gpus.WriteResult` from every write, never raising for a
device-level failure.

Every write re-reads the UUID of the device at the given index immediately
before writing and refuses to write if it is not the UUID the caller read at
the start of its step. A write is reported ``OK`` only when the NVML call
itself returned ``NVML_SUCCESS`` (``pynvml``'s wrappers raise for every other
return code); there is no post-write readback.

XID and double-bit ECC events come from an NVML event set drained by a thread
(:mod:`capwatch.agent.nvml.event_watch`, which gets its NVML calls from here).
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable
from functools import partial
from types import TracebackType
from typing import Any, TypeVar

import pynvml  # noqa: TID251 - the one module allowed to import it

from capwatch.agent.gpus import GpuError, GpuErrorClass, PowerConstraints, WriteOutcome, WriteResult
from capwatch.agent.health.telemetry import (
    NO_READINGS,
    DeviceEvent,
    DeviceEventKind,
    EventAccumulator,
    Readings,
    ThrottleReason,
)
from capwatch.agent.nvml.event_watch import WAIT_MS, EventWatch, RawEvent
from capwatch.kit.errors import BackendUnavailable

_log = logging.getLogger(__name__)

_T = TypeVar("_T")

# nvmlDeviceSetPowerManagementLimit takes a C unsigned int: ctypes would
# silently wrap anything outside this range into a different, valid-looking cap.
_UINT_MAX = 0xFFFF_FFFF

_CLASS_BY_CODE: dict[int, GpuErrorClass] = {
    int(pynvml.NVML_ERROR_UNINITIALIZED): GpuErrorClass.UNINITIALIZED,
    int(pynvml.NVML_ERROR_INVALID_ARGUMENT): GpuErrorClass.INVALID_ARGUMENT,
    int(pynvml.NVML_ERROR_NOT_SUPPORTED): GpuErrorClass.NOT_SUPPORTED,
    int(pynvml.NVML_ERROR_NO_PERMISSION): GpuErrorClass.NO_PERMISSION,
    int(pynvml.NVML_ERROR_NOT_FOUND): GpuErrorClass.NOT_FOUND,
    int(pynvml.NVML_ERROR_INSUFFICIENT_POWER): GpuErrorClass.INSUFFICIENT_POWER,
    int(pynvml.NVML_ERROR_DRIVER_NOT_LOADED): GpuErrorClass.DRIVER_NOT_LOADED,
    int(pynvml.NVML_ERROR_TIMEOUT): GpuErrorClass.TIMEOUT,
    int(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND): GpuErrorClass.LIBRARY_NOT_FOUND,
    int(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND): GpuErrorClass.FUNCTION_NOT_FOUND,
    int(pynvml.NVML_ERROR_GPU_IS_LOST): GpuErrorClass.GPU_IS_LOST,
    int(pynvml.NVML_ERROR_RESET_REQUIRED): GpuErrorClass.RESET_REQUIRED,
    int(pynvml.NVML_ERROR_IN_USE): GpuErrorClass.IN_USE,
}


def classify(code: int) -> GpuErrorClass:
    """The :class:`GpuErrorClass` of an ``nvmlReturn_t`` code; unlisted codes are UNKNOWN."""
    return _CLASS_BY_CODE.get(code, GpuErrorClass.UNKNOWN)


_READS = ("power_draw", "enforced_limit", "throttle_reasons", "ecc", "row_remap")

_THROTTLE_BITS: tuple[tuple[int, ThrottleReason], ...] = (
    (pynvml.nvmlClocksEventReasonGpuIdle, ThrottleReason.GPU_IDLE),
    (
        pynvml.nvmlClocksEventReasonApplicationsClocksSetting,
        ThrottleReason.APPLICATIONS_CLOCKS_SETTING,
    ),
    (pynvml.nvmlClocksEventReasonSwPowerCap, ThrottleReason.SW_POWER_CAP),
    (pynvml.nvmlClocksEventReasonHwSlowdown, ThrottleReason.HW_SLOWDOWN),
    (pynvml.nvmlClocksEventReasonSyncBoost, ThrottleReason.SYNC_BOOST),
    (pynvml.nvmlClocksEventReasonSwThermalSlowdown, ThrottleReason.SW_THERMAL_SLOWDOWN),
    (pynvml.nvmlClocksEventReasonHwThermalSlowdown, ThrottleReason.HW_THERMAL_SLOWDOWN),
    (pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown, ThrottleReason.HW_POWER_BRAKE_SLOWDOWN),
    (pynvml.nvmlClocksEventReasonDisplayClockSetting, ThrottleReason.DISPLAY_CLOCK_SETTING),
)


def throttle_reasons(mask: int) -> tuple[ThrottleReason, ...]:
    """The reasons set in an ``nvmlClocksEventReason*`` bit mask, sorted; unknown bits dropped."""
    return tuple(
        sorted((reason for bit, reason in _THROTTLE_BITS if mask & bit), key=lambda r: r.value)
    )


def _clock_event_reasons(handle: Any) -> int:
    """The clock-event reason mask; drivers before 535 export only the older name."""
    try:
        return int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
    except pynvml.NVMLError_FunctionNotFound:
        return int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))


def uuid_text(value: object) -> str:
    """A UUID as ``str``, whether the bindings returned ``bytes`` (older) or ``str``."""
    if isinstance(value, bytes):
        return value.decode("ascii")
    if isinstance(value, str):
        return value
    raise TypeError(f"unexpected UUID type {type(value).__name__}")


def _failure(exc: BaseException) -> tuple[GpuErrorClass, int | None, str]:
    """Class, NVML code (None for non-NVML exceptions) and description of an exception."""
    if isinstance(exc, pynvml.NVMLError):
        code = int(exc.value)
        try:
            text = str(exc)
        except Exception:  # noqa: BLE001 - describing an error must not raise another
            text = "NVML error"
        return classify(code), code, f"{text} (code={code})"
    if isinstance(exc, pynvml.NVMLLibraryMismatchError):
        # pynvml raises this instead of NVMLError_FunctionNotFound from its
        # unversioned wrappers (e.g. nvmlDeviceGetComputeRunningProcesses).
        code = int(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return GpuErrorClass.FUNCTION_NOT_FOUND, code, f"{exc} (code={code})"
    return GpuErrorClass.UNKNOWN, None, f"{type(exc).__name__}: {exc}"


def _checked(op: str, call: Callable[[], _T]) -> _T:
    """``call()``, with any failure raised as a classified GpuError naming ``op``."""
    try:
        return call()
    except Exception as exc:
        error_class, code, text = _failure(exc)
        raise GpuError(
            f"{op} failed: error_class={error_class.value} {text}",
            error_class=error_class,
            code=code,
        ) from exc


_WATCHED = {
    DeviceEventKind.XID: int(pynvml.nvmlEventTypeXidCriticalError),
    DeviceEventKind.ECC_DOUBLE_BIT: int(pynvml.nvmlEventTypeDoubleBitEccError),
}


class _EventCalls:
    """:class:`~capwatch.agent.nvml.event_watch.EventCalls` on one NVML event set."""

    def __init__(self, event_set: Any) -> None:
        self._set = event_set

    def supported_types(self, handle: Any) -> int:
        return _checked(
            "supported event types", lambda: int(pynvml.nvmlDeviceGetSupportedEventTypes(handle))
        )

    def register(self, handle: Any, event_types: int) -> None:
        _checked(
            "register events",
            lambda: pynvml.nvmlDeviceRegisterEvents(handle, event_types, self._set),
        )

    def wait(self, timeout_ms: int) -> RawEvent:
        data = _checked("event wait", lambda: pynvml.nvmlEventSetWait_v2(self._set, timeout_ms))
        return RawEvent(
            event_type=int(data.eventType), data=int(data.eventData), handle=data.device
        )

    def index_of(self, handle: Any) -> int:
        return _checked("event device index", lambda: int(pynvml.nvmlDeviceGetIndex(handle)))

    def uuid_of(self, handle: Any) -> str:
        return _checked("event device uuid", lambda: uuid_text(pynvml.nvmlDeviceGetUUID(handle)))

    def key_of(self, handle: Any) -> int | None:
        return ctypes.cast(handle, ctypes.c_void_p).value

    def free(self) -> None:
        _checked("event set free", lambda: pynvml.nvmlEventSetFree(self._set))


class NvmlBackend:
    """:class:`~capwatch.agent.gpus.GpuBackend` over NVML. Construction calls ``nvmlInit``.

    Safe to use from several threads (the cycle thread and a shutdown restore):
    NVML is thread-safe, and the lock here guards only this object's own
    closed flag, never an NVML call, so a hung call blocks only its caller.
    Every device is registered for events after init (no event set: logged,
    the backend works without events); see :mod:`capwatch.agent.nvml.event_watch`.
    """

    def __init__(self, *, event_wait_ms: int = WAIT_MS) -> None:
        self._event_wait_ms = event_wait_ms  # one event wait; close() stops the thread in ~this
        self._lock = threading.Lock()
        self._closed = False
        self._events = EventAccumulator()
        try:
            pynvml.nvmlInit()
        except Exception as exc:
            error_class, _, text = _failure(exc)  # text ends "(code=9)" when NVML gave one
            raise BackendUnavailable(
                f"NVML initialisation failed: error_class={error_class.value} {text}"
            ) from exc
        _log.info("nvml initialised")
        self._watch = self._start_events()

    @classmethod
    def open(cls, *, event_wait_ms: int = WAIT_MS) -> NvmlBackend:
        """Load and initialise NVML. Raises BackendUnavailable."""
        return cls(event_wait_ms=event_wait_ms)

    def __enter__(self) -> NvmlBackend:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _start_events(self) -> EventWatch | None:
        try:
            calls = _EventCalls(_checked("event set create", pynvml.nvmlEventSetCreate))
        except GpuError as exc:
            _log.warning("nvml device events unavailable: %s", exc)
            return None
        try:
            count = _checked("device count", lambda: int(pynvml.nvmlDeviceGetCount()))
        except GpuError as exc:  # the devices get registered from readings()
            _log.warning("nvml events: %s", exc)
            count = 0
        watch = EventWatch(calls, self._events, watched=_WATCHED, wait_ms=self._event_wait_ms)
        for index in range(count):
            try:
                handle = _checked(f"handle index={index}", partial(self._handle, index))
            except GpuError as exc:  # retried from readings()
                _log.warning("nvml events not registered: %s", exc)
                continue
            watch.register(index, handle)
        watch.start()
        return watch

    # -- reads ------------------------------------------------------------

    def device_count(self) -> int:
        return self._read("device_count", None, lambda: int(pynvml.nvmlDeviceGetCount()))

    def uuid(self, index: int) -> str:
        return self._read(
            "uuid", index, lambda: uuid_text(pynvml.nvmlDeviceGetUUID(self._handle(index)))
        )

    def constraints(self, index: int) -> PowerConstraints:
        def call() -> PowerConstraints:
            handle = self._handle(index)
            low, high = pynvml.nvmlDeviceGetPowerManagementLimitConstraints(handle)
            default = pynvml.nvmlDeviceGetPowerManagementDefaultLimit(handle)
            return PowerConstraints(
                min_milliwatts=int(low), max_milliwatts=int(high), default_milliwatts=int(default)
            )

        return self._read("constraints", index, call)

    def processes(self, index: int) -> tuple[int, ...]:
        def call() -> tuple[int, ...]:
            infos = pynvml.nvmlDeviceGetComputeRunningProcesses(self._handle(index))
            return tuple(int(info.pid) for info in infos)

        return self._read("processes", index, call)

    def readings(self, index: int) -> Readings:
        if self._is_closed():
            return NO_READINGS
        try:
            handle = self._handle(index)
        except Exception as exc:  # noqa: BLE001 - becomes "nothing read"
            error_class, _, _ = _failure(exc)
            return Readings(failed_reads=_READS, lost=error_class is GpuErrorClass.GPU_IS_LOST)
        if self._watch is not None:
            self._watch.register(index, handle)  # a device that appeared since init
        failed: list[str] = []
        lost = False

        def read(name: str, call: Callable[[], _T]) -> _T | None:
            nonlocal lost
            try:
                return call()
            except Exception as exc:  # noqa: BLE001 - one read never stops the others
                error_class, _, _ = _failure(exc)
                if error_class is not GpuErrorClass.NOT_SUPPORTED:
                    failed.append(name)
                    lost |= error_class is GpuErrorClass.GPU_IS_LOST
                return None

        def remapped() -> tuple[bool, bool]:
            _corrected, _uncorrected, pending, failure = pynvml.nvmlDeviceGetRemappedRows(handle)
            return bool(pending), bool(failure)

        draw = read("power_draw", lambda: int(pynvml.nvmlDeviceGetPowerUsage(handle)))
        enforced = read(
            "enforced_limit", lambda: int(pynvml.nvmlDeviceGetEnforcedPowerLimit(handle))
        )
        mask = read("throttle_reasons", lambda: _clock_event_reasons(handle))
        ecc = read(
            "ecc",
            lambda: int(
                pynvml.nvmlDeviceGetTotalEccErrors(
                    handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
                )
            ),
        )
        remap = read("row_remap", remapped)
        retired = None
        if remap is None and "row_remap" not in failed:  # older parts: page retirement
            retired = read(
                "retired_pages",
                lambda: (
                    int(pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))
                    == pynvml.NVML_FEATURE_ENABLED
                ),
            )
        return Readings(
            power_draw_milliwatts=draw,
            enforced_limit_milliwatts=enforced,
            throttle_reasons=None if mask is None else throttle_reasons(mask),
            ecc_uncorrected_volatile=ecc,
            row_remap_pending=None if remap is None else remap[0],
            row_remap_failure=None if remap is None else remap[1],
            retired_pages_pending=retired,
            failed_reads=tuple(failed),
            lost=lost,
        )

    def drain_events(self) -> tuple[DeviceEvent, ...]:
        return self._events.drain()

    def events_dropped_total(self) -> int:
        return self._events.dropped_total

    # -- writes -----------------------------------------------------------

    def set_limit(self, index: int, *, uuid: str, milliwatts: int) -> WriteResult:
        if not 0 <= milliwatts <= _UINT_MAX:
            return self._result(
                "set_limit",
                index,
                WriteOutcome.FAILED,
                GpuErrorClass.INVALID_ARGUMENT,
                f"milliwatts={milliwatts} does not fit an unsigned int; not written",
            )
        return self._write("set_limit", index, uuid, lambda _handle: milliwatts)

    def restore_default(self, index: int, *, uuid: str) -> WriteResult:
        def default_of(handle: Any) -> int:
            return int(pynvml.nvmlDeviceGetPowerManagementDefaultLimit(handle))

        return self._write("restore_default", index, uuid, default_of)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._watch is not None:
            self._watch.close()  # stops its thread first, then frees the set
        try:
            pynvml.nvmlShutdown()
        except Exception as exc:  # noqa: BLE001 - shutdown failures are logged, never raised
            error_class, code, text = _failure(exc)
            _log.warning(
                "nvml shutdown failed error_class=%s code=%s detail=%s",
                error_class.value,
                code,
                text,
            )
        else:
            _log.info("nvml shut down")

    # -- internals --------------------------------------------------------

    def _is_closed(self) -> bool:
        with self._lock:
            return self._closed

    @staticmethod
    def _handle(index: int) -> Any:
        # Handles are fetched per operation, never cached: the index -> device
        # mapping is exactly what can change between cycles.
        return pynvml.nvmlDeviceGetHandleByIndex(index)

    def _read(self, op: str, index: int | None, call: Callable[[], _T]) -> _T:
        if self._is_closed():
            raise GpuError(
                f"{op} index={index}: NVML backend is closed",
                error_class=GpuErrorClass.UNINITIALIZED,
            )
        return _checked(f"{op} index={index}", call)

    def _write(self, op: str, index: int, uuid: str, target: Callable[[Any], int]) -> WriteResult:
        if self._is_closed():
            return self._result(
                op,
                index,
                WriteOutcome.FAILED,
                GpuErrorClass.UNINITIALIZED,
                "NVML backend is closed; not written",
            )
        try:
            handle = self._handle(index)
            found = uuid_text(pynvml.nvmlDeviceGetUUID(handle))
        except Exception as exc:  # noqa: BLE001 - becomes a typed outcome
            error_class, _, text = _failure(exc)
            return self._result(
                op,
                index,
                WriteOutcome.IDENTITY_UNCONFIRMED,
                error_class,
                f"pre-write UUID read failed: {text}; not written",
            )
        if found != uuid:
            return self._result(
                op,
                index,
                WriteOutcome.IDENTITY_MISMATCH,
                None,
                f"expected uuid={uuid} found uuid={found}; not written",
            )
        try:
            milliwatts = target(handle)
        except Exception as exc:  # noqa: BLE001 - becomes a typed outcome
            error_class, _, text = _failure(exc)
            return self._result(
                op,
                index,
                WriteOutcome.FAILED,
                error_class,
                f"default limit read failed: {text}; not written",
            )
        try:
            pynvml.nvmlDeviceSetPowerManagementLimit(handle, milliwatts)
        except Exception as exc:  # noqa: BLE001 - becomes a typed outcome
            error_class, _, text = _failure(exc)
            return self._result(
                op,
                index,
                WriteOutcome.FAILED,
                error_class,
                f"uuid={uuid} milliwatts={milliwatts} write failed: {text}",
            )
        # pynvml raised for every return code but NVML_SUCCESS, so this took.
        _log.debug(
            "nvml write applied op=%s index=%s uuid=%s milliwatts=%s", op, index, uuid, milliwatts
        )
        return WriteResult(outcome=WriteOutcome.OK, applied_milliwatts=milliwatts)

    @staticmethod
    def _result(
        op: str,
        index: int,
        outcome: WriteOutcome,
        error_class: GpuErrorClass | None,
        detail: str,
    ) -> WriteResult:
        _log.info(
            "nvml write not applied op=%s index=%s outcome=%s error_class=%s detail=%s",
            op,
            index,
            outcome.value,
            error_class.value if error_class else None,
            detail,
        )
        return WriteResult(outcome=outcome, error_class=error_class, detail=detail)
