"""Readiness as seen from the other end of the stream (the ``/readyz`` shim's view).

The agent reports ages measured on its monotonic clock at send time; the shim
adds its own monotonic time since it received them. Wall clocks never enter:
stepping either machine's clock changes nothing. The rule itself is the
agent's (:func:`capwatch.kit.readiness.evaluate`).

Fail closed: from the moment the stream is lost the answer is ``stream-lost``,
until a fresh enforced cycle arrives on a new stream. A snapshot after a
reconnect is not enough, because it describes a cycle the shim may already
have judged stale.
"""

from __future__ import annotations

from dataclasses import dataclass

from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.kit.readiness import Readiness, ReadinessReason, evaluate


@dataclass(frozen=True, kw_only=True)
class _Observation:
    enforced: bool
    failure_summary: str
    cycle_age_s: float  # as reported by the agent at send time
    good_age_s: float | None
    received_at: float  # shim's monotonic clock


class StreamReadiness:
    """Folds stream messages into readiness; ``evaluate(now)`` applies the rule."""

    def __init__(self) -> None:
        self._stale_after_s: float | None = None
        self._last: _Observation | None = None
        self._lost = False
        self._ever_connected = False

    @property
    def lost(self) -> bool:
        return self._lost

    def on_snapshot(self, snapshot: pb.NodeSnapshot, *, received_at: float) -> None:
        self._stale_after_s = snapshot.stale_after.ToTimedelta().total_seconds()
        self._ever_connected = True
        if self._lost or not snapshot.HasField("last_cycle"):
            return
        self._observe(snapshot.last_cycle, snapshot.readiness, received_at)

    def on_cycle(self, cycle: pb.CycleReport, *, received_at: float) -> None:
        self._observe(cycle, cycle.readiness, received_at)
        if cycle.enforced:
            self._lost = False

    def on_heartbeat(self, heartbeat: pb.Heartbeat, *, received_at: float) -> None:
        """A heartbeat refreshes the age of the cycle already seen (it grows if none lands)."""
        last = self._last
        readiness = heartbeat.readiness
        if self._lost or last is None or not readiness.HasField("last_cycle_age"):
            return
        self._last = _Observation(
            enforced=last.enforced,
            failure_summary=last.failure_summary,
            cycle_age_s=readiness.last_cycle_age.ToTimedelta().total_seconds(),
            good_age_s=_age(readiness, "last_good_cycle_age"),
            received_at=received_at,
        )

    def on_lost(self) -> None:
        self._lost = True

    def evaluate(self, now: float) -> Readiness:
        last = self._last
        elapsed = 0.0 if last is None else max(0.0, now - last.received_at)
        good_age = None if last is None or last.good_age_s is None else last.good_age_s + elapsed
        if self._lost or not self._ever_connected:
            return Readiness(
                ready=False,
                reason=ReadinessReason.STREAM_LOST if self._lost else ReadinessReason.NO_CYCLE_YET,
                last_good_age_s=good_age,
            )
        return evaluate(
            last_cycle_enforced=None if last is None else last.enforced,
            last_cycle_age_s=None if last is None else last.cycle_age_s + elapsed,
            last_good_age_s=good_age,
            stale_after_s=self._stale_after_s or float("inf"),
            failure_summary="" if last is None else last.failure_summary,
        )

    def _observe(self, cycle: pb.CycleReport, readiness: pb.Readiness, received_at: float) -> None:
        self._last = _Observation(
            enforced=cycle.enforced,
            failure_summary=cycle.failure_summary,
            cycle_age_s=_age(readiness, "last_cycle_age") or 0.0,
            good_age_s=_age(readiness, "last_good_cycle_age"),
            received_at=received_at,
        )


def _age(readiness: pb.Readiness, field: str) -> float | None:
    if not readiness.HasField(field):  # type: ignore[arg-type]
        return None
    age: float = getattr(readiness, field).ToTimedelta().total_seconds()
    return age
