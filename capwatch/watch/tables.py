"""Human-readable text for capwatch.v1 and DRA health messages (``capwatch watch``, the demo).

Laid out by :mod:`capwatch.watch.layout`: owners (and, on very narrow
terminals, reasons) are cut with an ellipsis, and with no width (a pipe or a
file) every column is shown. REASON takes spare width before OWNERS, and a
GPU's faults come first in it, so a cut never hides them. Wall clock times are
local and for humans only; ages are the agent's, at send time, plus however
long ago that message arrived.

The boards keep what a screen shows: the latest full picture (redrawn in
place on a terminal), what changed since the last message (all that is
printed elsewhere), and that picture again at a later time (``block_at``: its
ages counted on, for a watch whose stream was lost).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.api.gen.v1 import dra_health_pb2 as v1_pb
from capwatch.api.gen.v1alpha1 import dra_health_pb2 as v1alpha1_pb
from capwatch.watch.layout import (
    FAILED,
    GOOD,
    HEADER,
    QUIET,
    Column,
    Line,
    Segment,
    Style,
    flow,
    table,
    wrapped,
)

DraResponse = v1_pb.NodeWatchResourcesResponse | v1alpha1_pb.NodeWatchResourcesResponse

GPU_COLUMNS = (
    Column(name="GPU", min=3, max=3),
    Column(name="HEALTH", min=9, max=9, rank=6),
    Column(name="UUID", min=13, max=16, rank=4, grow=3),
    Column(name="OUTCOME", min=8, max=8),
    Column(name="REASON", min=32, max=56, grow=1, floor=12),
    Column(name="OWNERS", min=16, max=48, grow=2, floor=8),
    Column(name="REQ W", min=5, max=6, rank=3, grow=4),
    Column(name="RES W", min=5, max=6, rank=5, grow=5),
    Column(name="APPLIED", min=11, max=11, rank=1),
    Column(name="SOURCE", min=21, max=48, rank=2, grow=6),
    Column(name="POWER", min=7, max=7, rank=3),
)
DRA_COLUMNS = (
    Column(name="POOL", min=12, max=40, grow=2, floor=6),
    Column(name="DEVICE", min=8, max=24, grow=3, floor=6),
    Column(name="HEALTH", min=9, max=9),
    Column(name="UPDATED", min=8, max=8, rank=1),
    Column(name="TIMEOUT", min=7, max=7, rank=2),
    Column(name="MESSAGE", min=20, max=80, grow=1, floor=10),
)
# The kubelet's HealthStatus numbers, the same in v1alpha1 and v1.
_DRA_HEALTH = {0: "unknown", 1: "healthy", 2: "unhealthy"}
_HEALTH_STYLE = {"healthy": GOOD, "unhealthy": FAILED, "unknown": "yellow"}
_OUTCOME_STYLE = {
    "enforced": GOOD,
    "failed": FAILED,
    "idle": QUIET,
    "released": "cyan",
    "observed": "cyan",
    "left": QUIET,
}


# --- capwatch.v1 --------------------------------------------------------------------


def cycle_heading(
    cycle: pb.CycleReport, width: int | None, *, elapsed_s: float = 0.0
) -> list[Line]:
    """``elapsed_s``: how long ago the cycle arrived (its ages count on by that much)."""
    millis = cycle.duration.ToTimedelta().total_seconds() * 1000
    parts: list[Line] = [
        ((f"cycle {cycle.sequence}", HEADER), (f"  {_clock(cycle.finished)}", "")),
        (_verdict(cycle), (f"  {millis:.1f} ms", "")),
    ]
    if cycle.abort_reason not in (pb.ABORT_REASON_UNSPECIFIED, pb.ABORT_REASON_NONE):
        abort = _enum(pb.AbortReason, cycle.abort_reason, "ABORT_REASON_")
        parts.append(((f"aborted: {abort}", FAILED),))
    if cycle.interrupted:
        parts.append((("(interrupted by shutdown)", "yellow"),))
    parts.append(readiness_segments(cycle.readiness, elapsed_s=elapsed_s))
    lines = flow(parts, width)
    for failure in cycle.failures:
        lines += wrapped(failure.message, width, first="  ! ", then="    ", style=FAILED)
    return lines


def cycle_summary(cycle: pb.CycleReport) -> Line:
    """One line for a cycle whose verdict changed: ``cycle 4  12:00:01  NOT ENFORCED: ...``."""
    line: Line = ((f"cycle {cycle.sequence}  {_clock(cycle.finished)}  ", ""), _verdict(cycle))
    if cycle.failure_summary:
        line += ((f": {cycle.failure_summary}", FAILED),)
    return line


def snapshot_heading(
    snapshot: pb.NodeSnapshot, width: int | None, *, elapsed_s: float = 0.0
) -> list[Line]:
    interval = snapshot.interval.ToTimedelta().total_seconds()
    parts: list[Line] = [
        ((f"snapshot{' (resync)' if snapshot.resync else ''}", HEADER),),
        ((f"node {snapshot.node_name}", ""),),
        ((f"agent {snapshot.agent_instance_id[:8]}", ""),),
        ((f"cycle {snapshot.sequence}", ""),),
        ((f"every {interval:g}s", ""),),
        readiness_segments(snapshot.readiness, elapsed_s=elapsed_s),
    ]
    return flow(parts, width)


def heartbeat_lines(
    heartbeat: pb.Heartbeat, width: int | None, *, elapsed_s: float = 0.0
) -> list[Line]:
    parts: list[Line] = [
        (("heartbeat", HEADER), (f"  {_clock(heartbeat.time)}", "")),
        ((f"cycle {heartbeat.last_sequence}", ""),),
        readiness_segments(heartbeat.readiness, elapsed_s=elapsed_s),
    ]
    return flow(parts, width)


def readiness_segments(readiness: pb.Readiness, *, elapsed_s: float = 0.0) -> Line:
    """The verdict and the last good cycle's age: as sent, plus ``elapsed_s`` (how long
    ago the message carrying it arrived)."""
    if readiness.ready:
        verdict: Segment = ("ready", GOOD)
    else:
        # Spelled as the agent, the shim and the logs spell it (cycle-failed).
        reason = _enum(pb.ReadinessReason, readiness.reason, "READINESS_REASON_").replace("_", "-")
        detail = f" ({readiness.detail})" if readiness.detail else ""
        verdict = (f"NOT READY: {reason}{detail}", FAILED)
    if readiness.HasField("last_good_cycle_age"):
        age = readiness.last_good_cycle_age.ToTimedelta().total_seconds() + max(0.0, elapsed_s)
        return (verdict, (f", last good cycle {age:.1f}s ago", ""))
    return (verdict, (", no good cycle yet", ""))


def gpu_table(devices: Iterable[pb.DeviceStatus], width: int | None) -> list[Line]:
    return table(GPU_COLUMNS, [(gpu_cells(d), gpu_styles(d)) for d in devices], width)


# The bound a clamped cap met: the GPU's range, or the cluster's floor and ceiling.
_CLAMP_MARKS = {
    pb.CLAMP_DIRECTION_LOWERED_TO_MAX: " (max)",
    pb.CLAMP_DIRECTION_RAISED_TO_MIN: " (min)",
    pb.CLAMP_DIRECTION_LOWERED_TO_CEILING: " (ceiling)",
    pb.CLAMP_DIRECTION_RAISED_TO_FLOOR: " (floor)",
}


def gpu_cells(device: pb.DeviceStatus) -> tuple[str, ...]:
    applied = "-"
    if device.HasField("applied_watts"):
        applied = f"{device.applied_watts} W"
        applied += _CLAMP_MARKS.get(device.clamp_direction, "")
    elif device.HasField("intended_watts"):  # observe mode: what it would write
        applied = f"({device.intended_watts} W)"
        applied += _CLAMP_MARKS.get(device.clamp_direction, "")
    source = _enum(pb.CapSource, device.cap_source, "CAP_SOURCE_")
    if device.safe_default_cause != pb.SAFE_DEFAULT_CAUSE_UNSPECIFIED:
        source += "/" + _enum(pb.SafeDefaultCause, device.safe_default_cause, "SAFE_DEFAULT_CAUSE_")
    if device.claims:  # the DRA claims that decided: docs/claims.md
        source += " " + ",".join(f"{c.namespace}/{c.name}" for c in device.claims)
    reason = device.reason or "-"
    if device.error_class:
        reason += f":{device.error_class}"
    if device.faults:  # in REASON, shown at every width and first (a cut keeps them): a
        # faulted GPU may read "ok", and a lost one's reason is long
        reason = "fault: " + ", ".join(f.summary for f in device.faults) + "; " + reason
    return (
        str(device.index),
        _enum(pb.DeviceHealth, device.health, "DEVICE_HEALTH_"),
        _short_uuid(device.uuid),
        _enum(pb.Outcome, device.outcome, "OUTCOME_"),
        reason,
        ",".join(_pod(owner) for owner in device.owners) or "-",
        str(device.requested_watts) if device.HasField("requested_watts") else "-",
        str(device.resolved_watts) if device.HasField("resolved_watts") else "-",
        applied,
        source,
        _power(device),
    )


def _power(device: pb.DeviceStatus) -> str:
    """The draw in watts, with a mark while the power cap is what holds the clocks back."""
    telemetry = device.telemetry
    if not telemetry.HasField("power_draw_milliwatts"):
        return "-"
    capped = "*" if "sw_power_cap" in telemetry.throttle_reasons else ""
    return f"{round(telemetry.power_draw_milliwatts / 1000)} W{capped}"


def gpu_styles(device: pb.DeviceStatus) -> tuple[Style, ...]:
    health = _HEALTH_STYLE.get(_enum(pb.DeviceHealth, device.health, "DEVICE_HEALTH_"), "")
    outcome = _OUTCOME_STYLE.get(_enum(pb.Outcome, device.outcome, "OUTCOME_"), "")
    bad = device.outcome == pb.OUTCOME_FAILED or bool(device.faults)
    return ("", health, "", outcome, FAILED if bad else "", "", "", "", "", "", "")


# --- DRA ---------------------------------------------------------------------------


def dra_lines(response: DraResponse, version: str, width: int | None) -> list[Line]:
    head = flow([((f"DRA {version} device list", HEADER),), ((_count(response), ""),)], width)
    return [*head, *table(DRA_COLUMNS, [dra_row(d) for d in response.devices], width)]


def dra_row(device: Any) -> tuple[tuple[str, ...], tuple[Style, ...]]:
    health = _DRA_HEALTH.get(device.health, str(device.health))
    cells = (
        device.device.pool_name,
        device.device.device_name,
        health,
        time.strftime("%H:%M:%S", time.localtime(device.last_updated_time)),
        f"{device.health_check_timeout_seconds}s",
        device.message,
    )
    style = _HEALTH_STYLE.get(health, "")
    return cells, ("", "", style, "", "", FAILED if style == FAILED else "")


# --- boards: what a screen shows ---------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Frame:
    """``block``: everything, to redraw in place; ``changes``: what is new since the last
    frame, to print where nothing can be redrawn (empty: nothing to print); ``notes``:
    lines of history for above a redrawn block."""

    block: tuple[Line, ...]
    changes: tuple[Line, ...] = ()
    notes: tuple[Line, ...] = ()


class GpuBoard:
    """The per-GPU picture of one agent, from a snapshot and the messages after it.

    Each message's ``received_at`` is the client's monotonic clock when it arrived
    (:mod:`capwatch.client.stream_events`): :meth:`block_at` ages the picture from it."""

    def __init__(self) -> None:
        self._devices: dict[int, pb.DeviceStatus] = {}
        # What the heading shows (the latest snapshot or cycle) and when it arrived.
        self._shown: pb.NodeSnapshot | pb.CycleReport | None = None
        self._shown_at = 0.0
        self._heading: list[Line] = []
        self._verdict: tuple[object, ...] | None = None
        self._readiness: tuple[bool, int] | None = None
        self._beat: pb.Heartbeat | None = None  # the heartbeat line under the table
        self._beat_at = 0.0
        self._status: list[Line] = []

    def snapshot(
        self, snapshot: pb.NodeSnapshot, width: int | None, *, received_at: float = 0.0
    ) -> Frame:
        self._devices = {d.index: d for d in snapshot.devices}
        self._shown, self._shown_at = snapshot, received_at
        self._heading = snapshot_heading(snapshot, width)
        self._readiness = _readiness_key(snapshot.readiness)
        if snapshot.HasField("last_cycle"):
            self._verdict = _verdict_key(snapshot.last_cycle, snapshot.readiness)
        self._beat, self._status = None, []
        block = self._block(width)
        return Frame(block=block, changes=(*block, ()))

    def cycle(self, cycle: pb.CycleReport, width: int | None, *, received_at: float = 0.0) -> Frame:
        changed = [
            d
            for d in cycle.devices
            if d.index not in self._devices or gpu_cells(self._devices[d.index]) != gpu_cells(d)
        ]
        self._devices.update((d.index, d) for d in cycle.devices)
        self._shown, self._shown_at = cycle, received_at
        self._heading = cycle_heading(cycle, width)
        self._readiness = _readiness_key(cycle.readiness)
        verdict = _verdict_key(cycle, cycle.readiness)
        moved, self._verdict = verdict != self._verdict, verdict
        self._beat, self._status = None, []
        changes: list[Line] = []
        if changed or moved:
            changes = [*self._heading, *(gpu_table(changed, width) if changed else ()), ()]
        notes = (cycle_summary(cycle),) if moved else ()
        return Frame(block=self._block(width), changes=tuple(changes), notes=notes)

    def heartbeat(
        self, heartbeat: pb.Heartbeat, width: int | None, *, received_at: float = 0.0
    ) -> Frame:
        key = _readiness_key(heartbeat.readiness)
        moved, self._readiness = key != self._readiness, key
        self._beat, self._beat_at = heartbeat, received_at
        self._status = heartbeat_lines(heartbeat, width)
        return Frame(block=self._block(width), changes=tuple(self._status) if moved else ())

    def block_at(self, now: float, width: int | None) -> tuple[Line, ...]:
        """The picture as of ``now`` (the clock of ``received_at``): what was last
        received, its ages counted on since it arrived."""
        if isinstance(self._shown, pb.NodeSnapshot):
            heading = snapshot_heading(self._shown, width, elapsed_s=now - self._shown_at)
        elif isinstance(self._shown, pb.CycleReport):
            heading = cycle_heading(self._shown, width, elapsed_s=now - self._shown_at)
        else:
            heading = []
        status: list[Line] = []
        if self._beat is not None:
            status = heartbeat_lines(self._beat, width, elapsed_s=now - self._beat_at)
        return (*heading, *self._table(width), *status)

    def _block(self, width: int | None) -> tuple[Line, ...]:
        return (*self._heading, *self._table(width), *self._status)

    def _table(self, width: int | None) -> list[Line]:
        return gpu_table([self._devices[i] for i in sorted(self._devices)], width)


class DeviceBoard:
    """The kubelet's device list: each full list received, and which devices changed."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], tuple[str, ...]] = {}
        self._last: tuple[DraResponse, str] | None = None

    def devices(self, response: DraResponse, version: str, width: int | None) -> Frame:
        rows = {(d.device.pool_name, d.device.device_name): dra_row(d) for d in response.devices}
        # UPDATED moves with every re-send; the rest is what a change is.
        now = {key: cells[:3] + cells[4:] for key, (cells, _) in rows.items()}
        changed = [rows[key] for key, cells in now.items() if self._seen.get(key) != cells]
        first, self._seen = not self._seen, now
        self._last = (response, version)
        block = tuple(dra_lines(response, version, width))
        if first:
            return Frame(block=block, changes=(*block, ()))
        if not changed:
            return Frame(block=block)
        return Frame(block=block, changes=(*block[:1], *table(DRA_COLUMNS, changed, width), ()))

    def block_at(self, now: float, width: int | None) -> tuple[Line, ...]:
        """The last list received (it has no ages: UPDATED is a clock time)."""
        del now
        return () if self._last is None else tuple(dra_lines(*self._last, width))


def _verdict_key(cycle: pb.CycleReport, readiness: pb.Readiness) -> tuple[object, ...]:
    failures = tuple(f.kind for f in cycle.failures)
    return (cycle.enforced, cycle.abort_reason, failures, _readiness_key(readiness))


def _readiness_key(readiness: pb.Readiness) -> tuple[bool, int]:
    return readiness.ready, readiness.reason


def _verdict(cycle: pb.CycleReport) -> Segment:
    return ("ENFORCED", GOOD) if cycle.enforced else ("NOT ENFORCED", FAILED)


def _count(response: DraResponse) -> str:
    return f"{len(response.devices)} devices"


def _enum(kind: Any, value: int, prefix: str) -> str:
    """``OUTCOME_ENFORCED`` -> ``enforced``; unset -> ``-``; unknown (newer agent) -> number."""
    try:
        name: str = kind.Name(value)
    except ValueError:
        return str(value)
    return "-" if name.endswith("_UNSPECIFIED") else name.removeprefix(prefix).lower()


def _pod(ref: pb.PodRef) -> str:
    return f"{ref.namespace}/{ref.name}" if ref.name else f"uid:{ref.uid[:8]}"


def _short_uuid(uuid: str) -> str:
    if not uuid:
        return "?"
    # UUIDs share long prefixes; the tail is what tells GPUs apart.
    return uuid if len(uuid) <= 16 else uuid[:4] + "…" + uuid[-8:]


def _clock(stamp: Timestamp) -> str:
    if stamp.seconds == 0 and stamp.nanos == 0:
        return "--:--:--"
    return time.strftime("%H:%M:%S", time.localtime(stamp.seconds))
