"""Keeping one DeviceTaintRule per faulted GPU of this shard's nodes, fenced and bounded.

What the rules should be comes from each node's latest cycle
(:func:`capwatch.controller.taints.device_taints`); what they are comes from the API: listed
(this release's, by label) each time this replica starts to lead, then kept from its
own writes. Each rule is a key of a work queue (client-go's shape,
:mod:`capwatch.controller.writes.workqueue`): a rule queued twice is written once, with the
latest wish; one that fails is retried after its own backoff, for ever; and every
write first takes a token of one rate limit (:data:`DEFAULT_QPS` a second, bursts of
:data:`DEFAULT_BURST`), so a thousand GPUs faulting at once are a thousand creates
spread over a minute, not a storm.

- **Fault**: the rule is created (or its taint replaced, if the category or effect
  changed); one ``DeviceTainted`` Event on the Node (at most one per node per
  ten minutes: the rules carry each device's message).
- **Recovery**: the rule goes after ``hold_down_s`` with the device healthy; a
  fault again within it keeps the rule (a flapping GPU does not churn the API).
- **The node goes** (deleted, or no longer a GPU node): its rules go at once.
- **A node not known** when this replica starts to lead (its agent not heard yet):
  its rules stay until its first cycle says otherwise, or ``hold_down_s`` passes
  with the node still unknown (deleted while no leader watched): then they go.
- **A faulted GPU no slice names**: no rule; one ``DeviceTaintSkipped`` Event says
  why (the Node condition and its Events say the rest).

Only the Lease holder writes, under the same fence as the condition writer: a
write starts only before the fence closes and is not sent after it; while fenced,
rules are held and queued again on :meth:`TaintWriter.resume`. A standby never
writes one. Runs on one event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from typing import Any, Protocol

from capwatch.controller.conditions import AgentLink
from capwatch.controller.errors import ApiError, DeadlinePassed, FencedOut, FieldConflict, NotFound
from capwatch.controller.leasing import Fence
from capwatch.controller.taints import (
    DeviceTaint,
    PlacedRule,
    TaintPolicy,
    Untainted,
    device_taints,
    placed_rule,
    rule_object,
)
from capwatch.controller.tracking import NodeState
from capwatch.controller.writes.recorder import EventRecorder, EventType
from capwatch.controller.writes.workqueue import ItemBackoff, WorkQueue
from capwatch.kit.backoff import Backoff
from capwatch.kit.clock import Clock
from capwatch.kit.observing import UNOBSERVED
from capwatch.kit.pacing import TokenBucket
from capwatch.kube.wire import WRITE_TIMEOUT_S

log = logging.getLogger(__name__)

DEFAULT_WORKERS = 4
DEFAULT_QPS = 20.0
DEFAULT_BURST = 40
LIST_TIMEOUT_S = 30.0
RETRY_BACKOFF = Backoff(initial_s=0.5, max_s=60.0)
CONFLICT_REASON = "GPUDeviceTaintRuleConflict"


class TaintApi(Protocol):
    async def list_taint_rules(
        self, *, label_selector: str, deadline_s: float
    ) -> list[dict[str, Any]]:
        """This release's rules. Raises ApiError."""

    async def apply_taint_rule(
        self, name: str, body: dict[str, Any], *, deadline: float
    ) -> dict[str, Any]:
        """Server-side apply under the controller's field manager, not forced (created if
        absent); returns what the server stored. Raises FieldConflict (another manager
        owns a field the rule sets), DeadlinePassed, FencedOut, ApiError."""

    async def delete_taint_rule(self, name: str, *, deadline: float) -> None:
        """Delete. Raises NotFound, DeadlinePassed, FencedOut, ApiError."""


class TaintObserver(Protocol):
    """What the metrics count."""

    def taint_written(self, *, action: str, result: str) -> None: ...

    def taint_rules(self, count: int) -> None: ...


class TaintWriter:
    """A :class:`~capwatch.controller.tracking.NodeListener` that keeps this shard's rules."""

    def __init__(
        self,
        *,
        api: TaintApi,
        events: EventRecorder,
        fence: Fence,
        clock: Clock,
        policy: TaintPolicy,
        ours: Callable[[str], bool],
        known: Callable[[str], bool],
        workers: int = DEFAULT_WORKERS,
        qps: float = DEFAULT_QPS,
        burst: int = DEFAULT_BURST,
        observer: TaintObserver | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._api = api
        self._events = events
        self._fence = fence
        self._clock = clock
        self._policy = policy
        self._ours = ours  # is a node of this shard
        self._known = known  # does the tracker know the node
        self._workers = workers
        self._bucket = TokenBucket(rate=qps, burst=burst, clock=clock)
        self._observer: TaintObserver = observer or UNOBSERVED
        self._rng = rng or random.Random()
        self._wanted: dict[str, DeviceTaint] = {}  # rule name -> the rule it should be
        self._by_node: dict[str, set[str]] = {}  # node -> its rules, wanted or placed
        self._placed: dict[str, PlacedRule] = {}  # what the API holds (listed, then ours)
        self._release_at: dict[str, float] = {}  # rule -> when it may go (monotonic)
        self._skipped: dict[str, frozenset[tuple[int, tuple[str, ...]]]] = {}
        self._listed = False
        self._held: set[str] = set()
        self._queue: WorkQueue[str] = WorkQueue(
            rate_limiter=ItemBackoff(RETRY_BACKOFF, rng=self._rng)
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._listing: asyncio.Task[None] | None = None

    # --- inputs --------------------------------------------------------------------------

    def node_changed(self, state: NodeState) -> None:
        if not self._policy.enabled or not self._ours(state.node):
            return
        observation = state.observation
        if observation.link is not AgentLink.CONNECTED or observation.cycle is None:
            return  # nothing known of its GPUs now: its rules stay as they are
        if observation.cycle.abort_reason:
            return  # a cycle that reached no GPU says nothing of them
        node = state.node
        wanted, untainted = device_taints(node, observation.gpus, self._policy)
        mine = self._by_node.setdefault(node, set())
        for name, taint in wanted.items():
            self._release_at.pop(name, None)
            if self._wanted.get(name) != taint:
                self._wanted[name] = taint
                self._enqueue(name)
            mine.add(name)
        now = self._clock.monotonic()
        for name in mine - wanted.keys():
            self._wanted.pop(name, None)
            if name not in self._release_at:
                self._release_at[name] = now + self._policy.hold_down_s
                self._queue.add_after(name, self._policy.hold_down_s)
        self._skip(node, untainted)

    def node_removed(self, node: str) -> None:
        """The node is gone: its rules go now (no hold-down: there is no device left)."""
        now = self._clock.monotonic()
        for name in self._by_node.pop(node, set()):
            self._wanted.pop(name, None)
            self._release_at[name] = now
            self._enqueue(name)
        self._skipped.pop(node, None)

    def resume(self) -> None:
        """This replica leads now: read what rules are in place, then write the rest."""
        if not self._policy.enabled:
            return
        self._listed = False
        if self._listing is None or self._listing.done():
            self._listing = asyncio.create_task(self._list(), name="capwatch-taint-list")
        held, self._held = self._held, set()
        for name in held:
            self._enqueue(name)

    @property
    def placed(self) -> dict[str, PlacedRule]:
        return dict(self._placed)

    # --- running -------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._work(), name=f"capwatch-taint-writer-{i}")
            for i in range(self._workers)
        ]

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        return list(self._tasks)

    async def stop(self) -> None:
        """Start no new write; wait for those in flight (each bounded by its timeout)."""
        if self._listing is not None:
            self._listing.cancel()
        await self._queue.shut_down_with_drain()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def _enqueue(self, name: str) -> None:
        self._queue.add(name)

    def _skip(self, node: str, untainted: list[Untainted]) -> None:
        """One Event per new set of faulted GPUs that cannot have a rule."""
        seen = frozenset((u.index, u.faults) for u in untainted)
        if seen == self._skipped.get(node, frozenset()):
            return
        new = [u for u in untainted if (u.index, u.faults) not in self._skipped.get(node, ())]
        self._skipped[node] = seen
        if new:
            message = "; ".join(u.message() for u in new)
            log.warning("node=%s device fault without a DeviceTaintRule: %s", node, message)
            asyncio.get_running_loop().create_task(
                self._events.post(node, EventType.WARNING, "DeviceTaintSkipped", message),
                name="capwatch-taint-skipped-event",
            )

    async def _list(self) -> None:
        """This release's rules, until one list succeeds (the fence need not be open)."""
        attempt = 0
        while True:
            try:
                items = await self._api.list_taint_rules(
                    label_selector=self._policy.selector(), deadline_s=LIST_TIMEOUT_S
                )
                break
            except ApiError as exc:
                delay = RETRY_BACKOFF.delay(attempt, self._rng, floor_s=exc.retry_after)
                log.warning("listing DeviceTaintRules failed: %s; again in %.1fs", exc, delay)
                attempt += 1
                await asyncio.sleep(delay)
        placed = [rule for obj in items if (rule := placed_rule(obj)) is not None]
        self._placed = {rule.name: rule for rule in placed if self._ours(rule.node)}
        now = self._clock.monotonic()
        for rule in self._placed.values():
            self._by_node.setdefault(rule.node, set()).add(rule.name)
            if rule.name not in self._wanted and not self._known(rule.node):
                # Deleted while nobody led, or not heard from yet: given the hold-down.
                self._release_at.setdefault(rule.name, now + self._policy.hold_down_s)
                self._queue.add_after(rule.name, self._policy.hold_down_s)
        self._listed = True
        self._observer.taint_rules(len(self._placed))
        for name in {*self._wanted, *(n for n in self._release_at if n in self._placed)}:
            self._enqueue(name)

    async def _work(self) -> None:
        while (name := await self._queue.get()) is not None:
            try:
                await self._write(name)
            except Exception:  # one rule's surprise must not stop the worker
                log.exception("writing DeviceTaintRule %s failed unexpectedly", name)
                self._queue.add_rate_limited(name)
            finally:
                self._queue.done(name)

    def _action(self, name: str) -> str | None:
        """What the rule needs now: create, update, delete, or nothing (None)."""
        taint = self._wanted.get(name)
        placed = self._placed.get(name)
        if taint is not None:
            if placed is not None and placed.spec_key == taint.spec_key:
                self._queue.forget(name)
                return None
            return "update" if placed is not None else "create"
        due = self._release_at.get(name)
        if due is None:
            return None
        left = due - self._clock.monotonic()
        if left > 0:
            self._queue.add_after(name, left)
            return None
        if placed is None:  # never written, or gone already: nothing to remove
            self._release_at.pop(name, None)
            return None
        return "delete"

    def _open_until(self, name: str, action: str) -> float | None:
        """The write's deadline, or None (held) when the fence is closed."""
        closes = self._fence.write_deadline()
        now = self._clock.monotonic()
        if closes <= now:
            self._held.add(name)
            self._observer.taint_written(action=action, result="fenced")
            return None
        return min(closes, now + WRITE_TIMEOUT_S)

    async def _write(self, name: str) -> None:
        if not self._listed:
            self._held.add(name)  # resume() lists, then queues everything again
            return
        action = self._action(name)
        if action is None or self._open_until(name, action) is None:
            return
        await self._bucket.take()
        # The wait may have taken the fence past its deadline: read it again.
        deadline = self._open_until(name, action)
        if deadline is None:
            return
        try:
            if action == "delete":
                await self._delete(name, deadline)
            else:
                await self._put(name, self._wanted[name], self._placed.get(name), deadline)
        except DeadlinePassed:
            self._observer.taint_written(action=action, result="expired")
            self._queue.add(name)
            return
        except FencedOut as exc:
            self._observer.taint_written(action=action, result="refused")
            self._held.add(name)
            self._fence.lost(str(exc))
            return
        except ApiError as exc:
            conflict = isinstance(exc, FieldConflict)
            if not conflict:
                log.warning("DeviceTaintRule %s %s failed: %s", name, action, exc)
            self._observer.taint_written(action=action, result="conflict" if conflict else "failed")
            self._queue.add_rate_limited(name, floor_s=exc.retry_after)
            return
        self._queue.forget(name)
        self._observer.taint_written(action=action, result="ok")
        self._observer.taint_rules(len(self._placed))

    async def _put(
        self, name: str, taint: DeviceTaint, placed: PlacedRule | None, deadline: float
    ) -> None:
        try:
            stored = await self._api.apply_taint_rule(
                name, rule_object(taint, self._policy), deadline=deadline
            )
        except FieldConflict as exc:
            # Another manager set a field of ours (an edit by hand, another tool): it
            # keeps it. Said on the Node, retried at the backoff, never forced.
            message = (
                f"DeviceTaintRule {name}: {', '.join(exc.managers)} owns fields capwatch "
                "sets; capwatch does not overwrite them"
            )
            log.warning("taint rule write refused: %s", message)
            await self._events.post(taint.node, EventType.WARNING, CONFLICT_REASON, message)
            raise
        rule = placed_rule(stored)
        if rule is not None:
            self._placed[name] = rule
        if placed is None:
            await self._events.post(
                taint.node, EventType.WARNING, "DeviceTainted", _said(taint, self._policy)
            )

    async def _delete(self, name: str, deadline: float) -> None:
        placed = self._placed.get(name)
        with contextlib.suppress(NotFound):  # gone already: what was wanted
            await self._api.delete_taint_rule(name, deadline=deadline)
        self._placed.pop(name, None)
        self._release_at.pop(name, None)
        if placed is not None and placed.node:
            for names in self._by_node.values():
                names.discard(name)
            await self._events.post(
                placed.node,
                EventType.NORMAL,
                "DeviceTaintRemoved",
                f"DeviceTaintRule {name} removed: the device recovered, or its node is gone",
            )


def _said(taint: DeviceTaint, policy: TaintPolicy) -> str:
    return f"DeviceTaintRule {taint.name(policy.release)}: {taint.message()}"
