"""Kubernetes Events on the pods whose GPUs the agent caps: feedback where pod owners look.

A pod owner who writes ``capwatch.io/gpu-power-limit`` would otherwise learn
what became of it only from the agent's stream, metrics or log. Each cycle's
report is turned into Events on the owner pods (``kubectl describe pod``
shows them): the cap applied, the safe default and why, a clamp into the
GPU's range, a failed write; in observe mode the cap that would have been
applied; with the unclaimed policy ``leave``, that no cap was set. An Event is
emitted when what it would say changes for that pod and GPU, not every cycle.

Events are best effort and never slow a cycle: reports are observed on the
event loop after the cycle, Events are posted by a daemon thread of their
own from a bounded queue, and when the queue is full or the API refuses,
they are dropped and counted (the stream and metrics remain the record).
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any, Protocol

from capwatch.agent.pods import PodRef
from capwatch.agent.reports import CapSource, ClampDirection, CycleReport, GpuResult, Outcome
from capwatch.kit.errors import CapwatchError

log = logging.getLogger(__name__)

QUEUE_SIZE = 1024
MAX_MESSAGE = 1024  # events.k8s.io's limit on a note; core/v1 accepts it too


class EventType(str, Enum):
    NORMAL = "Normal"
    WARNING = "Warning"


@dataclass(frozen=True, kw_only=True)
class PodEvent:
    pod: PodRef
    type: EventType
    reason: str  # UpperCamelCase, as Kubernetes reasons are
    message: str


@dataclass(frozen=True, kw_only=True)
class EventCounts:
    """Events posted, refused by the API (or failed to reach it), and dropped unsent."""

    posted: int
    failed: int
    dropped: int


class EventSinkError(CapwatchError):
    """The API did not take an Event."""


class EventSink(Protocol):
    def post(self, event: PodEvent) -> None:
        """Create the Event; raises EventSinkError."""


def event_body(
    event: PodEvent, *, node_name: str, wall: float, release: str = "capwatch"
) -> dict[str, Any]:
    """The core/v1 Event object for ``event``, as the API server takes it; its component is
    the release's agent (``RELEASE-agent``), so two releases' Events tell apart."""
    component = f"{release}-agent"
    now = datetime.fromtimestamp(wall, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    pod = event.pod
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{pod.name}.", "namespace": pod.namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": pod.namespace,
            "name": pod.name,
            "uid": pod.uid,
        },
        "type": event.type.value,
        "reason": event.reason,
        "message": event.message[:MAX_MESSAGE],
        "source": {"component": component, "host": node_name},
        "reportingComponent": component,
        "reportingInstance": node_name,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


# What a clamp direction says in an Event: the bound it met, and whose range that is.
_CLAMPS = {
    ClampDirection.RAISED_TO_MIN: ("its minimum", "its range"),
    ClampDirection.LOWERED_TO_MAX: ("its maximum", "its range"),
    ClampDirection.RAISED_TO_FLOOR: ("the cluster's floor", "the cluster's bounds"),
    ClampDirection.LOWERED_TO_CEILING: ("the cluster's ceiling", "the cluster's bounds"),
}


def events_for(result: GpuResult, *, annotation_key: str) -> list[PodEvent]:
    """What each owner pod of this GPU step should be told (nothing for idle steps).

    Pods the agent found only by UID in a GPU's processes (not in its pod
    view) have no name to address an Event to, and are skipped.
    """
    owners = [pod for pod in result.owners if pod.namespace and pod.name]
    if not owners or result.outcome in (Outcome.IDLE, Outcome.RELEASED):
        return []
    gpu = f"GPU {result.index} ({result.uuid or 'unknown UUID'})"
    if result.outcome is Outcome.OBSERVED:  # observe mode: what would have been written
        kind, reason = EventType.NORMAL, "PowerCapObserved"
        message = f"{gpu} {result.message}, nothing was written"
    elif result.outcome is Outcome.LEFT:  # unclaimed policy leave: nobody asked
        kind, reason = EventType.NORMAL, "PowerCapNotSet"
        message = f"{gpu} {result.message}"
    elif result.outcome is Outcome.FAILED:
        kind, reason = EventType.WARNING, "PowerCapFailed"
        message = f"{gpu}: {result.message}; the agent retries every cycle"
    elif result.clamp is not ClampDirection.NONE:
        kind, reason = EventType.WARNING, "PowerCapClamped"
        bound, scope = _CLAMPS[result.clamp]
        message = (
            f"{gpu} capped at {result.applied_watts} W, {bound}: "
            f"{result.requested_watts or result.resolved_watts} W is outside {scope}"
        )
    elif result.cap_source is CapSource.SAFE_DEFAULT and result.claims:
        # The claims decided (docs/claims.md); the step's message names each and why.
        kind, reason = EventType.WARNING, "PowerCapSafeDefault"
        why = result.claim_problem or "its claims ask for no single valid cap"
        message = f"{gpu} capped at the safe default {result.applied_watts} W: {why}"
    elif result.cap_source is CapSource.SAFE_DEFAULT:
        cause = result.safe_default_cause.value if result.safe_default_cause else "unknown"
        kind = EventType.NORMAL if cause in ("missing", "no_pod") else EventType.WARNING
        reason = "PowerCapSafeDefault"
        message = f"{gpu} capped at the safe default {result.applied_watts} W: " + _CAUSES.get(
            cause, cause
        ).format(key=annotation_key)
    else:
        kind, reason = EventType.NORMAL, "PowerCapApplied"
        message = f"{gpu} capped at {result.applied_watts} W, {_asked_by(result)}"
    return [PodEvent(pod=pod, type=kind, reason=reason, message=message) for pod in owners]


def _asked_by(result: GpuResult) -> str:
    if result.cap_source is CapSource.CLAIM:
        claims = ", ".join(str(claim) for claim in result.claims)
        return f"as claim {claims} asks" if len(result.claims) == 1 else f"as claims {claims} ask"
    return "as annotated" if result.cap_source is CapSource.ANNOTATION else "as all its pods ask"


_CAUSES = {
    "missing": "no {key} annotation",
    "invalid": "the {key} annotation is not a whole number of watts",
    "disagree": "the pods sharing it ask for different caps",
    "no_pod": "its processes belong to no pod the agent knows",
}


class PodEvents:
    """Observes reports (on the event loop) and posts changed Events (on its own thread)."""

    def __init__(self, sink: EventSink, *, annotation_key: str, queue_size: int = QUEUE_SIZE):
        self._sink = sink
        self._key = annotation_key
        self._last: dict[tuple[str, str], tuple[str, str]] = {}  # (pod uid, gpu) -> said
        self._queue: queue.Queue[PodEvent | None] = queue.Queue(maxsize=queue_size)
        self.dropped = 0
        self.failed = 0
        self.posted = 0
        self._thread = threading.Thread(target=self._run, name="capwatch-pod-events", daemon=True)
        self._thread.start()

    def observe(self, report: CycleReport) -> None:
        """Queue an Event for every pod and GPU whose story changed in ``report``.

        Never raises: it runs in the agent loop, which Events must not stop.
        """
        try:
            self._observe(report)
        except Exception:
            log.exception("pod events: cannot derive events from cycle %d", report.sequence)

    def _observe(self, report: CycleReport) -> None:
        for result in report.gpus:
            gpu = result.uuid or f"index-{result.index}"
            current = {pod.uid for pod in result.owners}
            for key in [k for k in self._last if k[1] == gpu and k[0] not in current]:
                del self._last[key]  # that pod left this GPU: tell it afresh if it returns
            for event in events_for(result, annotation_key=self._key):
                key, said = (event.pod.uid, gpu), (event.reason, event.message)
                if self._last.get(key) == said:
                    continue
                self._last[key] = said
                try:
                    self._queue.put_nowait(event)
                except queue.Full:
                    self.dropped += 1
                    if self.dropped == 1 or self.dropped % 100 == 0:
                        log.warning("pod events: queue full, %d dropped so far", self.dropped)

    def counts(self) -> EventCounts:
        return EventCounts(posted=self.posted, failed=self.failed, dropped=self.dropped)

    def close(self, timeout_s: float = 2.0) -> None:
        """Post what is queued (within ``timeout_s``), then stop the thread."""
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while (event := self._queue.get()) is not None:
            try:
                self._sink.post(event)
            except EventSinkError as exc:
                self.failed += 1
                if self.failed == 1 or self.failed % 100 == 0:
                    log.warning("pod events: %s (%d failed so far)", exc, self.failed)
            except Exception:  # a bug in a sink must not end the thread
                self.failed += 1
                log.exception("pod events: posting failed unexpectedly")
            else:
                self.posted += 1
