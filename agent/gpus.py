"""The GPU backend interface, and the typed outcome of every cap write.

Two backends implement :class:`GpuBackend`: ``agent.nvml.backend`` (the real NVML
library through ``pynvml``) and ``agent.sim.world`` (scenario-driven). Reads
raise :class:`GpuError`; writes never raise for a device-level failure, they
return a :class:`WriteResult` whose ``outcome`` is the only thing that says
whether the write took. A write that returns without error is *not* success
unless its outcome is ``OK``.

Every write names the UUID the caller read at the start of that GPU's step;
the backend re-reads the identity of the device at that index immediately
before writing and refuses (``IDENTITY_MISMATCH``) if it changed, so a cap is
never applied to a device that was re-enumerated mid-cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from capwatch.agent.health.telemetry import DeviceEvent, Readings
from capwatch.kit.errors import CapwatchError


class GpuErrorClass(str, Enum):
    """NVML failure classes the agent distinguishes (stable strings, used in reason text)."""

    UNINITIALIZED = "uninitialized"
    INVALID_ARGUMENT = "invalid_argument"
    NOT_SUPPORTED = "not_supported"
    NO_PERMISSION = "no_permission"
    NOT_FOUND = "not_found"
    INSUFFICIENT_POWER = "insufficient_power"
    DRIVER_NOT_LOADED = "driver_not_loaded"
    TIMEOUT = "timeout"
    LIBRARY_NOT_FOUND = "library_not_found"
    FUNCTION_NOT_FOUND = "function_not_found"
    GPU_IS_LOST = "gpu_is_lost"
    RESET_REQUIRED = "reset_required"
    IN_USE = "in_use"
    UNKNOWN = "unknown"


class WriteOutcome(str, Enum):
    """What happened to one power-limit write."""

    OK = "ok"
    FAILED = "failed"  # the library reported an error; error_class says which
    IDENTITY_MISMATCH = "identity_mismatch"  # the device at that index is not the expected UUID
    IDENTITY_UNCONFIRMED = "identity_unconfirmed"  # the pre-write identity read failed


@dataclass(frozen=True, kw_only=True)
class WriteResult:
    """The typed result of :meth:`GpuBackend.set_limit` / :meth:`GpuBackend.restore_default`."""

    outcome: WriteOutcome
    # The limit the device now carries as a result of this write, in milliwatts;
    # set only when outcome is OK (no post-write readback: the value written).
    applied_milliwatts: int | None = None
    error_class: GpuErrorClass | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome is WriteOutcome.OK


# No GPU shipped or announced draws more than this; a larger request, from any source
# (an annotation, a claim, a flag), is a typo (or milliwatts), not a request.
MAX_REQUEST_WATTS = 100_000


@dataclass(frozen=True, kw_only=True)
class PowerConstraints:
    """A device's settable power-limit range and its default, in milliwatts."""

    min_milliwatts: int
    max_milliwatts: int
    default_milliwatts: int


class GpuError(CapwatchError):
    """A backend read failed; ``error_class`` classifies the NVML error."""

    def __init__(
        self, message: str, *, error_class: GpuErrorClass, code: int | None = None
    ) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.code = code


class GpuBackend(Protocol):
    """What the reconcile loop needs from the GPUs. Indexes are NVML indexes."""

    def device_count(self) -> int:
        """Number of GPUs now visible. Raises GpuError."""
        ...

    def uuid(self, index: int) -> str:
        """The UUID of the device at ``index``. Raises GpuError."""
        ...

    def constraints(self, index: int) -> PowerConstraints:
        """Settable range and default limit. Raises GpuError."""
        ...

    def processes(self, index: int) -> tuple[int, ...]:
        """PIDs of the compute processes running on the device. Raises GpuError."""
        ...

    def set_limit(self, index: int, *, uuid: str, milliwatts: int) -> WriteResult:
        """Write a power limit, bound to ``uuid``. Never raises for device errors."""
        ...

    def restore_default(self, index: int, *, uuid: str) -> WriteResult:
        """Write the device's default limit back, bound to ``uuid``."""
        ...

    def readings(self, index: int) -> Readings:
        """This cycle's reads of the device at ``index`` (power, throttling, ECC, row
        remapping). Never raises: a read that is not supported or failed is ``None``
        in the result (see :class:`~capwatch.agent.health.telemetry.Readings`)."""
        ...

    def drain_events(self) -> tuple[DeviceEvent, ...]:
        """XID and double-bit ECC events since the last drain, aggregated. Never raises."""
        ...

    def events_dropped_total(self) -> int:
        """Device events dropped since start: more distinct GPU/kind/code keys arrived
        between two drains than are kept. Never raises."""
        ...

    def close(self) -> None:
        """Release the library (nvmlShutdown), stopping any event thread first. Idempotent."""
        ...
