"""Human-readable rendering of cycle reports (the demo and ``capwatch agent`` logs)."""

from __future__ import annotations

import time

from agent.pods import PodRef
from agent.reports import ClampDirection, CycleReport, GpuResult

_COLUMNS = ("GPU", "UUID", "OUTCOME", "REASON", "OWNERS", "REQ W", "RES W", "APPLIED", "SOURCE")


def render_report(report: CycleReport) -> str:
    """A heading line, then one row per GPU, as fixed-width text."""
    when = time.strftime("%H:%M:%S", time.localtime(report.finished_wall))
    verdict = "ENFORCED" if report.enforced else "NOT ENFORCED"
    head = f"cycle {report.sequence}  {when}  {verdict}  {report.duration_s * 1000:.1f} ms"
    if report.interrupted:
        head += "  (interrupted by shutdown)"
    lines = [head]
    lines += [f"  ! {failure.message}" for failure in report.failures]
    rows = [_COLUMNS, *(_row(gpu) for gpu in report.gpus)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    for row in rows:
        lines.append(
            "  "
            + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    return "\n".join(lines)


def _row(gpu: GpuResult) -> tuple[str, ...]:
    applied = "-" if gpu.applied_watts is None else f"{gpu.applied_watts} W"
    if gpu.clamp is ClampDirection.LOWERED_TO_MAX:
        applied += " (max)"
    elif gpu.clamp is ClampDirection.RAISED_TO_MIN:
        applied += " (min)"
    source = "-" if gpu.cap_source is None else gpu.cap_source.value
    if gpu.safe_default_cause is not None:
        source += f"/{gpu.safe_default_cause.value}"
    reason = gpu.reason.value
    if gpu.error_class is not None:
        reason += f":{gpu.error_class.value}"
    return (
        str(gpu.index),
        _short_uuid(gpu.uuid),
        gpu.outcome.value,
        reason,
        ",".join(_pod(p) for p in gpu.owners) or "-",
        _num(gpu.requested_watts),
        _num(gpu.resolved_watts),
        applied,
        source,
    )


def _pod(ref: PodRef) -> str:
    return str(ref) if ref.name else f"uid:{ref.uid[:8]}"


def _short_uuid(uuid: str | None) -> str:
    if uuid is None:
        return "?"
    # UUIDs share long prefixes; the tail is what tells GPUs apart.
    return uuid if len(uuid) <= 16 else uuid[:4] + "…" + uuid[-8:]


def _num(value: int | None) -> str:
    return "-" if value is None else str(value)
