"""Events on the Node for each change of its ``GPUPowerCapEnforced`` condition.

One Event per change of status or reason: ``Warning`` when the condition goes
False or Unknown, ``Normal`` when it comes back to True; its reason is the
condition's (``CapWriteFailed``, ``CapsEnforced``...), so ``kubectl get
events --field-selector involvedObject.name=NODE`` reads as the node's
history. Deduplicated: the same type and reason for the same node again
within :data:`DEDUPE_WINDOW_S` is not posted twice (a node flapping between
two states writes its condition each time, but its Events say it once). A
node first seen True (a fresh start, a new leader reading the Node) gets no
Event: nothing changed.

Events are best effort: a refused or failed post is logged and counted, not
retried; the condition is the record. Only the leader posts, under the same
fence as its condition writes (an Event not sent because the fence's deadline
passed before its thread got to it is counted ``expired``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from capwatch.controller.conditions import (
    Condition,
    ConditionReason,
    ConditionStatus,
    NodeCondition,
)
from capwatch.controller.errors import ApiError, DeadlinePassed, FencedOut
from capwatch.controller.leasing import Fence
from capwatch.kit.clock import Clock
from capwatch.kit.observing import UNOBSERVED
from capwatch.kube.wire import WRITE_TIMEOUT_S

log = logging.getLogger(__name__)

DEDUPE_WINDOW_S = 600.0


class EventType(str, Enum):
    NORMAL = "Normal"
    WARNING = "Warning"


@dataclass(frozen=True, kw_only=True)
class NodeEvent:
    node: str
    type: EventType
    reason: str
    message: str
    wall: float


class EventApi(Protocol):
    async def create_event(self, event: NodeEvent, *, deadline: float) -> None:
        """Post ``event`` on its Node; not sent, nor waited for, after ``deadline`` (an
        instant on the fence's monotonic clock). Raises DeadlinePassed, ApiError."""


class EventObserver(Protocol):
    def event(self, *, result: str) -> None: ...


class EventRecorder:
    def __init__(
        self,
        *,
        api: EventApi,
        fence: Fence,
        clock: Clock,
        observer: EventObserver | None = None,
        dedupe_window_s: float = DEDUPE_WINDOW_S,
    ) -> None:
        self._api = api
        self._fence = fence
        self._clock = clock
        self._observer: EventObserver = observer or UNOBSERVED
        self._window_s = dedupe_window_s
        # node -> (type, reason) -> when it was last posted
        self._last: dict[str, dict[tuple[EventType, str], float]] = {}

    async def transition(
        self, node: str, condition: Condition, *, previous: NodeCondition | None
    ) -> None:
        """The condition just written for ``node`` differs from ``previous`` (None: unknown)."""
        # Observe mode is False (nothing is enforced) by the operator's choice: not a warning.
        quiet = condition.status is ConditionStatus.TRUE or (
            condition.reason is ConditionReason.CAPS_OBSERVED
        )
        if previous is None and quiet:
            return
        kind = EventType.NORMAL if quiet else EventType.WARNING
        await self.post(node, kind, condition.reason.value, condition.message)

    async def post(self, node: str, kind: EventType, reason: str, message: str) -> None:
        """One Event on ``node``, unless one of the same type and reason was posted on it
        within the dedupe window (its device taints' Events too: at most one per node and
        reason, whatever a mass fault does; the rules themselves carry each device's)."""
        now = self._clock.monotonic()
        said = (kind, reason)
        last = self._last.get(node, {}).get(said)
        if last is not None and now - last < self._window_s:
            self._observer.event(result="deduplicated")
            return
        closes = self._fence.write_deadline()
        if closes <= now:
            self._observer.event(result="fenced")
            return
        event = NodeEvent(
            node=node, type=kind, reason=reason, message=message, wall=self._clock.wall()
        )
        # Counted as said before it is sent: a second post of the same while this one is
        # in flight (another writer's worker) is a duplicate too. Undone if it fails.
        sent = self._last.setdefault(node, {})
        before = sent.get(said)
        sent[said] = now
        try:
            await self._api.create_event(event, deadline=min(closes, now + WRITE_TIMEOUT_S))
        except DeadlinePassed:
            self._unsay(node, said, before)
            self._observer.event(result="expired")
            return
        except FencedOut as exc:
            self._unsay(node, said, before)
            self._observer.event(result="refused")
            self._fence.lost(str(exc))
            return
        except ApiError as exc:
            self._unsay(node, said, before)
            log.warning("event on node=%s not posted: %s", node, exc)
            self._observer.event(result="failed")
            return
        self._observer.event(result="posted")

    def _unsay(self, node: str, said: tuple[EventType, str], before: float | None) -> None:
        sent = self._last.get(node)
        if sent is None:
            return
        if before is None:
            sent.pop(said, None)
        else:
            sent[said] = before

    def forget(self, node: str) -> None:
        self._last.pop(node, None)
