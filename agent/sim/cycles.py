"""Ranges of reconcile cycles: when a scenario's pod, process or fault exists."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class CycleRange:
    """Inclusive range of cycle numbers; ``last`` None means forever.

    Cycles are numbered from 1 (the reconcile loop's sequence). Cycle 0 is the
    time before the first cycle begins (agent start-up); only the default range
    (:data:`ALWAYS`, used when a file gives no ``cycles``) includes it.
    """

    first: int = 0
    last: int | None = None

    def __post_init__(self) -> None:
        if self.first < 0 or (self.last is not None and self.last < self.first):
            raise ValueError(f"invalid cycle range first={self.first} last={self.last}")

    def contains(self, cycle: int) -> bool:
        return self.first <= cycle and (self.last is None or cycle <= self.last)

    def overlaps(self, other: CycleRange) -> bool:
        return (other.last is None or self.first <= other.last) and (
            self.last is None or other.first <= self.last
        )


ALWAYS = CycleRange()
