"""The scenario's device faults: what a simulated GPU says about itself, cycle by cycle.

A scenario's ``device_faults`` section lists faults of the devices themselves
(as opposed to ``faults``, which make backend calls fail or hang): XID errors,
uncorrectable ECC errors, a lost GPU, row remapping that failed or is pending,
throttling, reads that are not supported or fail, and a part old enough to
retire pages instead of remapping rows. Each item is one fault on one GPU
over a cycle range; ``docs/scenario.md`` documents the format and
``agent.sim.faults`` applies them as each cycle begins.

This module holds the values and their validation; the main parser
(``agent.sim.scenario``) calls :func:`parse_device_faults` with itself as the
:class:`Reader`, so errors carry the same path and ``file:line:column``.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import NoReturn, Protocol

from capwatch.agent.health.telemetry import ThrottleReason
from capwatch.agent.sim.cycles import ALWAYS, CycleRange
from capwatch.agent.sim.devices import READS

XID_MAX = 0xFFFF_FFFF  # NVML's XID fits 32 bits; real ones are small
# Events per cycle: a flood is one count (agent.health.telemetry), but not an unbounded one.
COUNT_MAX = 1_000_000


class DeviceFaultKind(str, Enum):
    XID = "xid"  # ``count`` XID events of number ``code``, every cycle of the range
    ECC = "ecc"  # ``count`` uncorrectable ECC errors, every cycle of the range
    LOST = "lost"  # every call answers "GPU is lost"; answers again (same UUID) after
    ROW_REMAP_FAILURE = "row_remap_failure"  # the row-remapping read says a remap failed
    ROW_REMAP_PENDING = "row_remap_pending"  # a remap waits for a reset (not a fault)
    THROTTLE = "throttle"  # extra clock-event reasons (not a fault)
    UNSUPPORTED = "unsupported"  # ``reads`` answer "not supported" (not a fault)
    FAILING = "failing"  # ``reads`` fail with another error (not a fault)
    OLDER_PART = "older_part"  # page retirement instead of row remapping

    @property
    def fires_events(self) -> bool:
        """Events each cycle of the range, rather than a state held during it."""
        return self in (DeviceFaultKind.XID, DeviceFaultKind.ECC)


# The keys each kind takes beyond gpu, kind and cycles: (required, optional).
_KEYS: dict[DeviceFaultKind, tuple[tuple[str, ...], tuple[str, ...]]] = {
    DeviceFaultKind.XID: (("code",), ("count",)),
    DeviceFaultKind.ECC: ((), ("count",)),
    DeviceFaultKind.THROTTLE: (("reasons",), ()),
    DeviceFaultKind.UNSUPPORTED: (("reads",), ()),
    DeviceFaultKind.FAILING: (("reads",), ()),
}
_COMMON = ("kind", "gpu", "cycles")
_EVERY_KEY = (*_COMMON, "code", "count", "reasons", "reads")


@dataclass(frozen=True, kw_only=True)
class DeviceFaultSpec:
    """One device fault on GPU ``gpu`` during ``cycles``.

    ``code`` is the XID number (``xid`` only); ``count`` the events per cycle
    (``xid``, ``ecc``); ``reasons`` the throttle reasons (``throttle``);
    ``reads`` the read names of :data:`capwatch.agent.sim.devices.READS` (``unsupported``,
    ``failing``). Raises ValueError when constructed inconsistently (the
    parser reports such files as ScenarioError).
    """

    kind: DeviceFaultKind
    gpu: int
    cycles: CycleRange = ALWAYS
    code: int = 0
    count: int = 1
    reasons: frozenset[ThrottleReason] = frozenset()
    reads: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        kind = self.kind
        lists_reads = kind in (DeviceFaultKind.UNSUPPORTED, DeviceFaultKind.FAILING)
        if (
            self.gpu < 0
            or (kind is DeviceFaultKind.XID) != (0 < self.code <= XID_MAX)
            or not (1 <= self.count <= COUNT_MAX)
            or (self.count != 1 and not kind.fires_events)
            or (kind is DeviceFaultKind.THROTTLE) != bool(self.reasons)
            or lists_reads != bool(self.reads)
            or not self.reads <= frozenset(READS)
        ):
            raise ValueError(f"inconsistent device fault {self!r}")


class Reader(Protocol):
    """What :func:`parse_device_faults` needs of the scenario parser."""

    def fail(self, option: str, reason: str) -> NoReturn: ...

    def mapping(
        self, value: object, path: str, required: tuple[str, ...], optional: tuple[str, ...]
    ) -> dict[str, object]: ...

    def sequence(self, value: object, path: str) -> list[object]: ...

    def integer(self, value: object, path: str, *, minimum: int = 1, what: str = "") -> int: ...

    def cycles(self, value: object, path: str) -> CycleRange: ...


def parse_device_faults(
    reader: Reader, value: object, *, gpu_count: int
) -> tuple[DeviceFaultSpec, ...]:
    """The ``device_faults`` list, validated. Raises ScenarioError (through ``reader``)."""
    return tuple(
        _device_fault(reader, item, f"device_faults[{i}]", gpu_count)
        for i, item in enumerate(reader.sequence(value, "device_faults"))
    )


def _device_fault(reader: Reader, item: object, path: str, gpu_count: int) -> DeviceFaultSpec:
    raw = reader.mapping(item, path, ("kind",), _EVERY_KEY[1:])
    kind = DeviceFaultKind(
        _choice(reader, raw["kind"], f"{path}.kind", [k.value for k in DeviceFaultKind], "kind")
    )
    required, optional = _KEYS.get(kind, ((), ()))
    for key in raw:
        if key not in _COMMON + required + optional:
            takes = f"; it takes {', '.join(required + optional)}" if required + optional else ""
            reader.fail(f"{path}.{key}", f"kind {kind.value!r} takes no {key!r}{takes}")
    reader.mapping(raw, path, ("kind", "gpu", *required), ("cycles", *optional))
    gpu = reader.integer(raw["gpu"], f"{path}.gpu", minimum=0, what="a GPU index")
    if gpu >= gpu_count:
        reader.fail(
            f"{path}.gpu", f"no GPU at index {gpu}; the scenario declares {gpu_count} GPU(s)"
        )
    code = 0
    if kind is DeviceFaultKind.XID:
        code = reader.integer(raw["code"], f"{path}.code", what="an XID number")
        if code > XID_MAX:
            reader.fail(f"{path}.code", f"an XID number is at most {XID_MAX}, got {code}")
    count = 1
    if "count" in raw:
        count = reader.integer(raw["count"], f"{path}.count", what="a number of events")
        if count > COUNT_MAX:
            reader.fail(f"{path}.count", f"at most {COUNT_MAX} events a cycle, got {count}")
    reasons = _names(
        reader,
        raw=raw,
        key="reasons",
        path=path,
        allowed=[r.value for r in ThrottleReason],
        what="reason",
    )
    return DeviceFaultSpec(
        kind=kind,
        gpu=gpu,
        cycles=reader.cycles(raw["cycles"], f"{path}.cycles") if "cycles" in raw else ALWAYS,
        code=code,
        count=count,
        reasons=frozenset(ThrottleReason(r) for r in reasons),
        reads=frozenset(
            _names(reader, raw=raw, key="reads", path=path, allowed=READS, what="read")
        ),
    )


def _names(
    reader: Reader,
    *,
    raw: dict[str, object],
    key: str,
    path: str,
    allowed: Sequence[str],
    what: str,
) -> list[str]:
    """The non-empty list of distinct names at ``key`` ([] when the kind takes none)."""
    if key not in raw:
        return []
    where = f"{path}.{key}"
    items = reader.sequence(raw[key], where)
    if not items:
        reader.fail(where, f"must name at least one {what}; expected some of: {', '.join(allowed)}")
    names: list[str] = []
    for i, item in enumerate(items):
        name = _choice(reader, item, f"{where}[{i}]", allowed, what)
        if name in names:
            reader.fail(f"{where}[{i}]", f"{name!r} is listed twice")
        names.append(name)
    return names


def _choice(reader: Reader, value: object, path: str, allowed: Sequence[str], what: str) -> str:
    if not isinstance(value, str) or value not in allowed:
        hint = difflib.get_close_matches(value, allowed, n=1) if isinstance(value, str) else []
        guess = f"; did you mean {hint[0]!r}?" if hint else ""
        reader.fail(
            path, f"unknown {what} {value!r}{guess} (expected one of: {', '.join(allowed)})"
        )
    return value
