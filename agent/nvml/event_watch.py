"""NVML device events (XID, double-bit ECC) fed into an :class:`EventAccumulator` by a thread.

:class:`EventWatch` registers devices on one NVML event set and runs a named
daemon thread that waits on it with a short timeout, so :meth:`EventWatch.close`
(flag, then join) returns within about one timeout. The NVML calls themselves
come from :mod:`capwatch.agent.nvml.backend` through :class:`EventCalls`, so this module never
imports ``pynvml``; every call raises :class:`~capwatch.agent.gpus.GpuError` on failure.

- An event's device is mapped to its index with ``nvmlDeviceGetIndex`` and to
  its UUID with ``nvmlDeviceGetUUID`` on the event's handle. If the index read
  fails (a lost GPU answers nothing) the index the handle was registered at is
  used; an unreadable UUID is ``None`` (the fault model then goes by index).
- A device that supports neither event type is logged once and not watched.
  A registration that fails otherwise is retried at the device's next
  :meth:`EventWatch.register` (the backend calls it from every ``readings``),
  which is also how devices that appear later (the count grows) get watched:
  in the first cycle that reads them.
- Wait errors never stop the thread and never make it spin: it backs off
  (doubling, up to :data:`BACKOFF_MAX_S`) and logs at most once per
  :data:`LOG_EVERY_S`, with the number of errors in between. "GPU is lost"
  from a wait names no device: it is logged the same way, and the lost GPU
  shows in its readings.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from capwatch.agent.gpus import GpuError, GpuErrorClass
from capwatch.agent.health.telemetry import DeviceEventKind, EventAccumulator
from capwatch.kit.throttling import ThrottledLog

log = logging.getLogger(__name__)

THREAD_NAME = "capwatch-nvml-events"
WAIT_MS = 500  # one wait; close() joins within about this
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 2.0
LOG_EVERY_S = 60.0


@dataclass(frozen=True, kw_only=True)
class RawEvent:
    """One ``nvmlEventData_t``: its type bits, data (the XID for XID events), device handle."""

    event_type: int
    data: int
    handle: object


class EventCalls(Protocol):
    """The NVML calls an :class:`EventWatch` makes. Each raises GpuError on failure."""

    def supported_types(self, handle: object) -> int:
        """``nvmlDeviceGetSupportedEventTypes``."""
        ...

    def register(self, handle: object, event_types: int) -> None:
        """``nvmlDeviceRegisterEvents`` on the watch's set."""
        ...

    def wait(self, timeout_ms: int) -> RawEvent:
        """``nvmlEventSetWait_v2``; GpuError(TIMEOUT) when nothing came."""
        ...

    def index_of(self, handle: object) -> int:
        """``nvmlDeviceGetIndex``."""
        ...

    def uuid_of(self, handle: object) -> str:
        """``nvmlDeviceGetUUID``."""
        ...

    def key_of(self, handle: object) -> int | None:
        """A stable identity of the device a handle names (its address)."""
        ...

    def free(self) -> None:
        """``nvmlEventSetFree``."""
        ...


class EventWatch:
    """An event set, the devices registered on it and the thread that drains it."""

    def __init__(
        self,
        calls: EventCalls,
        sink: EventAccumulator,
        *,
        watched: Mapping[DeviceEventKind, int],
        wait_ms: int = WAIT_MS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._calls = calls
        self._sink = sink
        self._watched = dict(watched)  # kind -> nvmlEventType bit
        self._mask = 0
        for bit in self._watched.values():
            self._mask |= bit
        self._wait_ms = wait_ms
        self._lock = threading.Lock()  # guards the maps below, never held across a call
        self._registered: dict[int, int | None] = {}  # index -> handle key
        self._index_by_key: dict[int, int] = {}
        self._warned: set[int] = set()  # indexes whose failed registration was logged
        self._stop = threading.Event()
        self._problems = ThrottledLog(log, burst=1, refill_s=LOG_EVERY_S, clock=monotonic)
        self._errors = 0
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)

    # -- registration -----------------------------------------------------

    def register(self, index: int, handle: object) -> None:
        """Watch the device at ``index`` unless already done for this handle. Never raises."""
        key = self._calls.key_of(handle)
        with self._lock:
            if self._stop.is_set() or (
                index in self._registered and self._registered[index] == key
            ):
                return
        try:
            wanted = self._calls.supported_types(handle) & self._mask
            if wanted:
                self._calls.register(handle, wanted)
        except GpuError as exc:
            if exc.error_class is not GpuErrorClass.NOT_SUPPORTED:
                with self._lock:
                    first = index not in self._warned
                    self._warned.add(index)
                if first:
                    log.warning("nvml events not registered index=%s (retried): %s", index, exc)
                return
            wanted = 0
        if not wanted:
            log.info("nvml device index=%s supports no XID or double-bit ECC events", index)
        with self._lock:
            self._registered[index] = key
            self._warned.discard(index)
            if key is not None:
                self._index_by_key[key] = index

    # -- the thread -------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    @property
    def errors(self) -> int:
        """Failed waits so far (timeouts are not failures)."""
        return self._errors

    def close(self, timeout: float | None = None) -> None:
        """Stop the thread (it joins within about one wait), then free the set. Never raises."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self._wait_ms / 1000 + 0.5 if timeout is None else timeout)
            if self._thread.is_alive():
                # A hung wait: freeing the set below is what may still wake it.
                log.warning("nvml event thread did not stop in time; freeing its event set")
        try:
            self._calls.free()
        except GpuError as exc:
            log.warning("nvml event set free failed: %s", exc)

    def _run(self) -> None:
        delay = 0.0
        log.info("nvml event thread started")
        while not self._stop.is_set():
            try:
                self._take(self._calls.wait(self._wait_ms))
                delay = 0.0
            except GpuError as exc:
                if exc.error_class is GpuErrorClass.TIMEOUT:
                    delay = 0.0
                    continue
                delay = self._failed(f"nvml event wait failed: {exc}", delay)
            except Exception as exc:  # noqa: BLE001 - the thread must outlive any one event
                delay = self._failed(f"nvml event handling failed: {exc!r}", delay)
        log.info("nvml event thread stopped")

    def _failed(self, text: str, delay: float) -> float:
        self._errors += 1
        delay = min(max(delay * 2, BACKOFF_MIN_S), BACKOFF_MAX_S)
        self._problems.warning("%s; backing off %.2f s", text, delay)
        self._stop.wait(delay)  # close() interrupts the back-off
        return delay

    def _take(self, event: RawEvent) -> None:
        kind = next((k for k, bit in self._watched.items() if event.event_type & bit), None)
        if kind is None:
            log.debug("nvml event of an unwatched type ignored type=%#x", event.event_type)
            return
        try:
            index = self._calls.index_of(event.handle)
        except GpuError as exc:
            key = self._calls.key_of(event.handle)
            with self._lock:
                found = None if key is None else self._index_by_key.get(key)
            if found is None:
                self._problems.warning(
                    "nvml %s event from an unknown device dropped: %s", kind.value, exc
                )
                return
            index = found
        try:
            uuid: str | None = self._calls.uuid_of(event.handle)
        except GpuError as exc:
            self._problems.warning(
                "nvml %s event index=%s: UUID unread: %s", kind.value, index, exc
            )
            uuid = None
        code = event.data if kind is DeviceEventKind.XID else 0
        self._sink.add(kind, index=index, uuid=uuid, code=code)
