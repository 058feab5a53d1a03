"""Building one cycle's :class:`~capwatch.agent.reports.CycleReport` as the reconciler goes.

The reconciler adds each GPU's result and each cycle-level failure as it
meets them; :meth:`CycleBuilder.finish` freezes the fold, with the cycle's
timing read from the clock. A cycle that raised gets :func:`crashed_report`.
"""

from __future__ import annotations

import logging

from capwatch.agent.health.telemetry import DeviceEvent
from capwatch.agent.reports import (
    AbortReason,
    CycleFailure,
    CycleFailureKind,
    CycleReport,
    GpuResult,
)
from capwatch.kit.clock import Clock

log = logging.getLogger("capwatch.agent.reconciling")


class CycleBuilder:
    """Accumulates one cycle's fold; ``finish`` freezes it into a CycleReport."""

    def __init__(self, *, sequence: int, clock: Clock, observe: bool = False) -> None:
        self._clock = clock
        self._observe = observe
        self._sequence = sequence
        self._started_wall = clock.wall()
        self._started_mono = clock.monotonic()
        self._gpus: list[GpuResult] = []
        self._failures: list[CycleFailure] = []
        self._unsaved_cycles = 0
        self._save_failures = 0
        self.events: tuple[DeviceEvent, ...] = ()
        self.abort_reason: AbortReason | None = None
        self.interrupted = False  # a shutdown short-circuited the cycle

    def add(self, result: GpuResult) -> None:
        self._gpus.append(result)

    def saved(self, *, unsaved_cycles: int, save_failures: int) -> None:
        self._unsaved_cycles = unsaved_cycles
        self._save_failures = save_failures

    def fail(self, kind: CycleFailureKind, message: str) -> None:
        log.warning("cycle failure kind=%s %s", kind.value, message)
        self._failures.append(CycleFailure(kind=kind, message=message))

    def finish(self) -> CycleReport:
        return CycleReport(
            sequence=self._sequence,
            started_wall=self._started_wall,
            finished_wall=self._clock.wall(),
            started_monotonic=self._started_mono,
            finished_monotonic=self._clock.monotonic(),
            gpus=tuple(self._gpus),
            failures=tuple(self._failures),
            abort_reason=self.abort_reason,
            interrupted=self.interrupted,
            unsaved_cycles=self._unsaved_cycles,
            save_failures=self._save_failures,
            events=self.events,
            observe=self._observe,
        )


def crashed_report(
    *,
    sequence: int,
    started_wall: float,
    started_monotonic: float,
    clock: Clock,
    exc: BaseException,
) -> CycleReport:
    """The report for a cycle that raised: failed, with no GPU results."""
    return CycleReport(
        sequence=sequence,
        started_wall=started_wall,
        finished_wall=clock.wall(),
        started_monotonic=started_monotonic,
        finished_monotonic=clock.monotonic(),
        failures=(
            CycleFailure(
                kind=CycleFailureKind.INTERNAL_ERROR,
                message=f"cycle raised {type(exc).__name__}: {exc}"[:300],
            ),
        ),
        abort_reason=AbortReason.INTERNAL_ERROR,
    )
