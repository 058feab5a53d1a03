"""Values describing the fake ``libnvidia-ml.so.1``: devices, faults, events, the
set-limit log, and the ``FAKE_NVML_CONFIG`` file that renders them (for subprocesses).

:mod:`tests.fakenvml.control` applies them to the loaded library and re-exports them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT_UUIDS = tuple(f"GPU-fa4e0000-0000-4000-8000-{i:012x}" for i in range(2))
DEFAULT_MIN_MW = 100_000
DEFAULT_MAX_MW = 400_000
DEFAULT_LIMIT_MW = 300_000
DEFAULT_DRAW_MW = 150_000

# nvmlEventType* bits (nvml.h).
EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID = 0x8
DEFAULT_EVENT_TYPES = EVENT_XID | EVENT_DOUBLE_BIT_ECC
MAX_QUEUED_EVENTS = 16_384  # the fake's queue; more are dropped and counted

ErrorSpec = str | int  # an nvmlReturn_t name ("NVML_ERROR_NO_PERMISSION") or number


@dataclass(frozen=True, kw_only=True)
class FakeDevice:
    """One fake GPU. ``current_milliwatts`` defaults to the default limit and
    ``enforced_milliwatts`` to the current limit (None: follow it).

    ``uuid`` may be raw bytes, to hand the bindings a UUID that is not valid text.
    ``older_part``: no row remapping (NOT_SUPPORTED), page retirement instead.
    ``lost``: every call naming the device returns NVML_ERROR_GPU_IS_LOST.
    """

    uuid: str | bytes
    min_milliwatts: int = DEFAULT_MIN_MW
    max_milliwatts: int = DEFAULT_MAX_MW
    default_milliwatts: int = DEFAULT_LIMIT_MW
    current_milliwatts: int | None = None
    pids: tuple[int, ...] = ()
    power_draw_milliwatts: int = DEFAULT_DRAW_MW
    enforced_milliwatts: int | None = None
    clocks_event_reasons: int = 0
    ecc_uncorrected_volatile: int = 0
    row_remap_pending: bool = False
    row_remap_failure: bool = False
    older_part: bool = False
    retired_pages_pending: bool = False
    supported_events: int = DEFAULT_EVENT_TYPES
    lost: bool = False

    def health_options(self) -> str:
        """The health options of this device's config-file ``device`` line."""
        enforced = "current" if self.enforced_milliwatts is None else self.enforced_milliwatts
        return (
            f"draw={self.power_draw_milliwatts} enforced={enforced} "
            f"clocks={self.clocks_event_reasons:#x} ecc={self.ecc_uncorrected_volatile} "
            f"remap_pending={int(self.row_remap_pending)} "
            f"remap_failure={int(self.row_remap_failure)} older_part={int(self.older_part)} "
            f"retired_pending={int(self.retired_pages_pending)} "
            f"events={self.supported_events:#x} lost={int(self.lost)}"
        )


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
class QueuedEvent:
    """``count`` events of ``event_type`` (an nvmlEventType bit) on device ``index``;
    ``data`` is the XID number for XID events."""

    index: int
    event_type: int = EVENT_XID
    data: int = 0
    count: int = 1


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
    events: tuple[QueuedEvent, ...] = ()
    init_error: ErrorSpec | None = None
    log_file: Path | None = None
    # Where the devices' limits live between processes (as a real GPU keeps its limit).
    limits_file: Path | None = None
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
                    f"current={dev.default_milliwatts if current is None else current} "
                    + dev.health_options()
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
        lines.extend(
            f"event {e.index} {e.event_type:#x} {e.data} count={e.count}" for e in self.events
        )
        if self.init_error is not None:
            lines.append(f"init_error {self.init_error}")
        if self.log_file is not None:
            lines.append(f"log_file {self.log_file}")
        if self.limits_file is not None:
            lines.append(f"limits_file {self.limits_file}")
        lines.extend(self.extra_lines)
        return "\n".join(lines) + "\n"

    def write(self, path: Path) -> Path:
        """Write the file; returns ``path`` (for ``FAKE_NVML_CONFIG``)."""
        path.write_text(self.render())
        return path


_LOG_LINE = re.compile(r"set_limit device=(-?\d+) uuid=(\S+) milliwatts=(\d+) rc=(\d+)")


def read_limits_file(path: Path) -> dict[str, int]:
    """The ``limits_file``: each device's current limit (milliwatts) by UUID ({} if none)."""
    if not path.is_file():
        return {}
    limits = {}
    for line in path.read_text().splitlines():
        uuid, _, milliwatts = line.partition(" ")
        limits[uuid] = int(milliwatts)
    return limits


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
