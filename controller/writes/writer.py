"""Writing ``GPUPowerCapEnforced`` to Nodes: only on change, heartbeat, fenced by the lease.

What is written where:

- a server-side apply of ``nodes/<name>/status`` carrying only the one
  condition, under the controller's field manager (``RELEASE-controller``:
  the Node's ``managedFields`` say which release owns it; the other
  conditions are untouched), when the condition's status or reason differs
  from what the Node carries, and as a heartbeat every ``heartbeat_s``
  (``lastHeartbeatTime``); a message-only change waits for the next of those,
  so a node's failing GPUs are not rewritten every cycle.
  ``lastTransitionTime`` moves only with the status. At 5,000 nodes and a 5
  minute heartbeat that is about 17 writes a second plus transitions;
- an Event on the Node for each change of status or reason (Warning for False
  and Unknown, Normal back to True), recorded by :mod:`capwatch.controller.writes.recorder`.

Field ownership. An apply whose fields another manager owns is refused (409)
and not forced blindly: the writer asks who owns the condition. Owners that
are capwatch's own past (``before-first-apply``, the API server's name for
writes made before any apply, and the ``capwatch-controller`` updates of
versions that patched) are taken over by forcing the apply; anyone else (a
second release's controller, a person's ``kubectl edit``) keeps it: the write
is counted ``conflict``, a Warning Event names the owners, and the node is
retried at its backoff, so it is written once they let go.

What the Node carries comes from the node watch (so a new leader starts from
the API's truth, not from nothing) and from this writer's own successful
writes, each with the Node's resourceVersion: the watch can deliver a Node as
it was before a write after that write's answer (a relist, events queued on
the loop), and such an older version is ignored rather than taken for the
truth, which would rewrite the newer condition and move its transition time
(resourceVersions compare as integers, KEP-5504; one that does not parse is
taken as it comes). Writes go through a work queue keyed by node
(:mod:`capwatch.controller.writes.workqueue`, client-go's shape: a node queued twice is
written once, with its latest state; one changed while its write is in
flight is written again after it, never beside it) served by a few workers;
news goes first: a node's first report that all is well (no condition of
ours on the Node yet, and True to write) waits behind every other change,
and heartbeats behind both. On a first install, or after the API server was
away, that is thousands of first reports at whatever rate the server takes
them (5,000 at about 15 a second on the real server, bench/scenarios/kwok.py: over 5
minutes), and a node failing meanwhile must not be written behind them, nor
behind a round of heartbeats.

Failures. A 429 is the server saying it is busy, not that this node is
wrong: the whole queue pauses for its Retry-After as given (at most 60 s; a
429 to a write sent before the pause began does not lengthen it), or, when it
gives none, for the one backoff counted over consecutive pauses; the node goes
back to its place, so under sustained throttling nodes are written in the order they
came, none twice while another waits. Any other failed write is retried
after the node's own backoff (the one backoff, full jitter, 0.5 s doubling to
60 s, the server's Retry-After as a floor, capped at those 60 s: a server
asking for an hour, or for ever, cannot freeze a node's condition) at the
place it had, for as long as it fails; a node that no longer exists is
dropped with everything kept for it. A pending retry never delays a newer
state: a node whose status or reason changes while its retry waits is
written at once (its backoff carries on from where it was, so a server that
keeps refusing still sees the node back off); a message-only change or a
heartbeat waits for the retry, which writes the latest state.

Fencing: no write starts unless the :class:`Fence` says this replica leads
and renewed its lease within the renew deadline, and its request carries the
instant that deadline runs out (at most :data:`WRITE_TIMEOUT_S` from now):
the API client does not send it after that instant, however late its thread
gets to it, and waits for it no longer (:mod:`capwatch.controller.kube`). While it may
not write, nothing is kept for it: when it leads again (:meth:`resume`) every
node whose condition differs or whose heartbeat is due is queued. A write not
sent because its deadline had passed is as if the fence had been closed: not
retried as a failure, but read against the fence again.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import replace
from typing import Protocol

from capwatch.controller.conditions import (
    CONDITION_TYPE,
    AgentLink,
    Condition,
    ConditionStatus,
    NodeCondition,
)
from capwatch.controller.errors import ApiError, DeadlinePassed, FencedOut, FieldConflict, NotFound
from capwatch.controller.leasing import Fence
from capwatch.controller.objects import FieldOwner
from capwatch.controller.tracking import NodeState
from capwatch.controller.writes.recorder import EventRecorder, EventType
from capwatch.controller.writes.workqueue import ItemBackoff, WorkQueue
from capwatch.kit.backoff import Backoff
from capwatch.kit.clock import Clock
from capwatch.kit.observing import UNOBSERVED
from capwatch.kube.wire import WRITE_TIMEOUT_S

log = logging.getLogger(__name__)

DEFAULT_HEARTBEAT_S = 300.0
# Queue priorities, lower first: news (a status or reason other than what the Node
# carries, or a first report that is not True), a first report of True, heartbeats.
_NEWS, _FIRST_REPORT, _HEARTBEAT = 0, 1, 2
DEFAULT_WORKERS = 8
RETRY_INITIAL_S = 0.5
RETRY_MAX_S = 60.0
RETRY_BACKOFF = Backoff(initial_s=RETRY_INITIAL_S, max_s=RETRY_MAX_S)
TOO_MANY_REQUESTS = 429
# Owners of the condition that are capwatch's own past: writes made before any apply,
# and the strategic-merge patches of versions before server-side apply (an Update whose
# manager came from the User-Agent, "capwatch-controller/<pod>").
BEFORE_APPLY = "before-first-apply"
LEGACY_OWNERS = frozenset(
    {
        FieldOwner(manager=BEFORE_APPLY, operation="Update"),
        FieldOwner(manager="capwatch-controller", operation="Update"),
    }
)
CONFLICT_REASON = "GPUPowerCapConditionConflict"


class ConditionApi(Protocol):
    async def apply_condition(
        self, node: str, condition: NodeCondition, *, deadline: float, force: bool = False
    ) -> int | None:
        """Server-side apply ``condition`` to the Node's status under the controller's
        field manager (``force``: take fields other managers own); not sent, nor waited
        for, after ``deadline`` (an instant on the fence's monotonic clock). The Node's
        resourceVersion after it (None: not comparable). Raises NotFound, FieldConflict,
        DeadlinePassed (not sent), ApiError."""

    async def condition_owners(self, node: str, *, deadline: float) -> tuple[FieldOwner, ...]:
        """Who owns any field of the Node's condition, but this controller's applies."""


class WriteObserver(Protocol):
    """What the metrics count."""

    def written(self, *, result: str, latency_s: float | None) -> None: ...


class ConditionWriter:
    def __init__(
        self,
        *,
        api: ConditionApi,
        events: EventRecorder,
        fence: Fence,
        clock: Clock,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        workers: int = DEFAULT_WORKERS,
        observer: WriteObserver | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._api = api
        self._events = events
        self._fence = fence
        self._clock = clock
        self._heartbeat_s = heartbeat_s
        self._workers = workers
        self._observer: WriteObserver = observer or UNOBSERVED
        self._rng = rng or random.Random()
        self._desired: dict[str, NodeState] = {}
        self._written: dict[str, NodeCondition] = {}
        self._versions: dict[str, int] = {}  # the newest resourceVersion seen of each Node
        # News, then first reports, then heartbeats; a node is never written beside itself.
        self._queue: WorkQueue[str] = WorkQueue(
            rate_limiter=ItemBackoff(RETRY_BACKOFF, rng=self._rng)
        )
        self._throttled = 0  # 429s in a row, for a pause when the server gives no Retry-After
        # Nodes whose retry is pending: the (status, reason) of the write that failed.
        self._retrying: dict[str, tuple[str, str]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.writes_in_flight = 0

    # --- inputs --------------------------------------------------------------------------

    def node_changed(self, state: NodeState) -> None:
        if state.observation.link is AgentLink.CONNECTING:
            # The controller's own ignorance, not news (controller.tracking): nothing
            # to write, and what was known before is no longer worth a heartbeat.
            self._desired.pop(state.node, None)
            return
        pending = self._desired.get(state.node)
        if (
            pending is not None
            and pending.cycle_end_at is not None
            and _key(pending.condition) == _key(state.condition)
            and self._needs_write(state.node)
        ):
            # Not written yet: its detection latency runs from the cycle that changed it.
            state = replace(state, cycle_end_at=pending.cycle_end_at)
        self._desired[state.node] = state
        if self._needs_write(state.node):
            self._enqueue(state.node)

    def node_removed(self, node: str) -> None:
        """``node`` is no longer this writer's: nothing is kept for it."""
        self._desired.pop(node, None)
        self._written.pop(node, None)
        self._versions.pop(node, None)
        self._retrying.pop(node, None)
        self._queue.forget(node)
        self._events.forget(node)

    def observed(
        self, node: str, condition: NodeCondition | None, *, version: int | None = None
    ) -> None:
        """What the API says the Node carries now (the node watch), at resourceVersion
        ``version`` (None: not comparable); older than one already seen, it is ignored."""
        known = self._versions.get(node)
        if version is not None and known is not None and version < known:
            return  # the Node as it was before a write this writer has the answer to
        if condition is None:
            # Gone, or no condition of ours (removed by someone: written again).
            self._written.pop(node, None)
        else:
            self._written[node] = condition
        if version is None:
            self._versions.pop(node, None)
        else:
            self._versions[node] = version
        if node in self._desired and self._needs_write(node):
            self._enqueue(node)

    def written(self, node: str) -> NodeCondition | None:
        return self._written.get(node)

    def resume(self) -> None:
        """This replica may write again (it leads): queue every node whose condition
        differs from what the Node carries or whose heartbeat is due."""
        now_wall = self._clock.wall()
        for node in self._desired:
            if self._needs_write(node):
                self._enqueue(node)
            elif self._heartbeat_due(node, now_wall):
                self._enqueue(node, heartbeat=True)

    # --- running -------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._work(), name=f"capwatch-condition-writer-{i}")
            for i in range(self._workers)
        ]
        self._tasks.append(asyncio.create_task(self._heartbeats(), name="capwatch-heartbeats"))

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        return list(self._tasks)

    async def stop(self) -> None:
        """Start no new write; wait for those in flight (each bounded by its timeout)."""
        # A write in flight is not cancelled: its request would go on without us (on
        # the API client's thread), past the release of the Lease. The drain waits for
        # it; idle workers get nothing more from the queue and end.
        await self._queue.shut_down_with_drain()
        for task in self._tasks:
            task.cancel()  # the heartbeat task; the workers have ended
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def _needs_write(self, node: str) -> bool:
        state = self._desired.get(node)
        if state is None:
            return False
        written = self._written.get(node)
        return written is None or written.key != _key(state.condition)

    def _heartbeat_due(self, node: str, now_wall: float) -> bool:
        written = self._written.get(node)
        return written is not None and now_wall - written.last_heartbeat_wall >= self._heartbeat_s

    def _enqueue(self, node: str, *, heartbeat: bool = False) -> None:
        if self._queue.waiting(node):
            failed, state = self._retrying.get(node), self._desired.get(node)
            if heartbeat or state is None or failed == _key(state.condition):
                return  # nothing newer than what failed: the retry writes it when due
            # A newer status or reason: written now, not after the retry's wait.
            self._queue.cancel_wait(node)
        self._queue.add(node, priority=_HEARTBEAT if heartbeat else self._urgency(node))

    def _urgency(self, node: str) -> int:
        state = self._desired.get(node)
        first = node not in self._written
        if first and state is not None and state.condition.status is ConditionStatus.TRUE:
            return _FIRST_REPORT
        return _NEWS

    async def _heartbeats(self) -> None:
        # Each node's heartbeat is due on its own schedule (when it was last
        # written), so they spread out over the heartbeat period by themselves.
        period = min(10.0, self._heartbeat_s / 10)
        while True:
            await asyncio.sleep(period)
            now_wall = self._clock.wall()
            for node in list(self._desired):
                if self._heartbeat_due(node, now_wall):
                    self._enqueue(node, heartbeat=True)

    async def _work(self) -> None:
        while (node := await self._queue.get()) is not None:
            try:
                await self._write(node)
            except Exception:  # one node's surprise must not stop the worker
                log.exception("writing the condition of node=%s failed unexpectedly", node)
                self._retry_later(node, None)
            finally:
                self._queue.done(node)

    async def _write(self, node: str) -> None:
        state = self._desired.get(node)
        if state is None:
            return
        now_wall = self._clock.wall()
        changed = self._needs_write(node)
        if not changed and not self._heartbeat_due(node, now_wall):
            return  # written meanwhile (by an earlier queue entry, or seen on the watch)
        # The fence and the instant it closes are read together, here on the loop: a
        # pause from now on cannot move the deadline the request is sent under.
        closes = self._fence.write_deadline()
        now = self._clock.monotonic()
        if closes <= now:
            self._observer.written(result="fenced", latency_s=None)
            return  # resume() queues it again
        deadline = min(closes, now + WRITE_TIMEOUT_S)
        previous = self._written.get(node)
        condition = state.condition
        payload = NodeCondition(
            status=condition.status,
            reason=condition.reason.value,
            message=condition.message,
            last_transition_wall=now_wall
            if previous is None or previous.status is not condition.status
            else previous.last_transition_wall,
            last_heartbeat_wall=now_wall,
        )
        self.writes_in_flight += 1
        try:
            version = await self._apply(node, payload, deadline=deadline)
        except ApiError as exc:
            await self._failed(node, condition, exc)
            return
        finally:
            self.writes_in_flight -= 1
        self._throttled = 0
        self._queue.forget(node)
        self._retrying.pop(node, None)
        self._written[node] = payload
        if version is not None:
            self._versions[node] = max(version, self._versions.get(node, version))
        latency = None
        if changed and state.cycle_end_at is not None:
            latency = max(0.0, self._clock.monotonic() - state.cycle_end_at)
        self._observer.written(result="ok", latency_s=latency)
        if changed:
            await self._events.transition(node, condition, previous=previous)
        # The state may have moved on while the write was in flight.
        if self._needs_write(node):
            self._enqueue(node)

    async def _failed(self, node: str, condition: Condition, exc: ApiError) -> None:
        """A write that did not land: what each kind of failure means for the node."""
        if isinstance(exc, DeadlinePassed):
            # Never sent: its thread got to it too late (a paused process, a busy API
            # client). Not a failure to back off from: read against the fence again.
            self._observer.written(result="expired", latency_s=None)
            self._queue.add(node)
        elif isinstance(exc, FencedOut):
            # Not ours to write: the Lease is someone else's. Like a fenced write,
            # written again once this replica leads (resume()).
            self._observer.written(result="refused", latency_s=None)
            self._fence.lost(str(exc))
        elif isinstance(exc, NotFound):
            log.info("node=%s is gone; not writing its condition", node)
            self._observer.written(result="not_found", latency_s=None)
            self.node_removed(node)
        elif isinstance(exc, FieldConflict):
            self._observer.written(result="conflict", latency_s=None)
            self._retry_later(node, None, failed=_key(condition))
            message = (
                f"{CONDITION_TYPE} on this Node is owned by {', '.join(exc.managers)}; "
                "capwatch does not overwrite it"
            )
            log.warning("condition write refused node=%s: %s", node, message)
            await self._events.post(node, EventType.WARNING, CONFLICT_REASON, message)
        elif exc.status == TOO_MANY_REQUESTS:
            # The server is busy, not this node: everyone waits, the node keeps its place.
            # A 429 to a write sent before the pause began is the same news: no longer.
            self._observer.written(result="throttled", latency_s=None)
            if not self._queue.paused():
                if exc.retry_after is not None:
                    pause = min(exc.retry_after, RETRY_MAX_S)  # as the server said
                else:
                    pause = RETRY_BACKOFF.delay(self._throttled, self._rng)
                    self._throttled += 1
                self._queue.pause(pause)
            self._queue.requeue(node)
        else:
            log.warning("condition write failed node=%s status=%s error=%s", node, exc.status, exc)
            self._observer.written(result="failed", latency_s=None)
            self._retry_later(node, exc.retry_after, failed=_key(condition))

    async def _apply(self, node: str, payload: NodeCondition, *, deadline: float) -> int | None:
        """The apply; refused for fields another manager owns, forced only when every
        owner is capwatch's own past (the module docstring)."""
        try:
            return await self._api.apply_condition(node, payload, deadline=deadline)
        except FieldConflict as exc:
            every = await self._api.condition_owners(node, deadline=deadline)
            # Those the refusal names (others may co-own a field at the same value); one
            # named but not listed is the API server's name for an object with no
            # managedFields at all, an Update by definition.
            owners = tuple(
                next(
                    (o for o in every if o.manager == name),
                    FieldOwner(manager=name, operation="Update" if name == BEFORE_APPLY else ""),
                )
                for name in exc.managers
            )
            if not owners or not set(owners) <= LEGACY_OWNERS:
                managers = tuple(o.manager for o in owners if o not in LEGACY_OWNERS)
                raise FieldConflict(str(exc), managers=managers or exc.managers) from exc
            taken = ", ".join(o.manager for o in owners)
            log.info("node=%s: taking %s over from %s", node, CONDITION_TYPE, taken)
            return await self._api.apply_condition(node, payload, deadline=deadline, force=True)

    def _retry_later(
        self, node: str, retry_after: float | None, *, failed: tuple[str, str] | None = None
    ) -> None:
        """Retry ``node`` after its backoff; ``failed``: the (status, reason) whose write
        failed (None: the node's desired state)."""
        # For ever, at most RETRY_MAX_S apart whatever Retry-After says (the backoff caps
        # it): a node refused for days (a 403 until its RBAC is fixed) is written within a
        # minute of the fix.
        state = self._desired.get(node)
        if state is None:
            return
        self._retrying[node] = failed or _key(state.condition)
        self._queue.add_rate_limited(node, floor_s=retry_after)


def _key(condition: Condition) -> tuple[str, str]:
    return (condition.status.value, condition.reason.value)
