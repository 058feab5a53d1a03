"""In-memory fakes of the controller's Protocols: the Kubernetes calls (conditions, Events,
Leases with real resourceVersion and 409 semantics), the fence, stream clients, listeners."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections import defaultdict
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import cast

from capwatch.client.retrying import MonotonicClock
from capwatch.client.stream_events import Event
from capwatch.controller.conditions import NodeCondition
from capwatch.controller.errors import ApiError, Conflict, FieldConflict, NotFound
from capwatch.controller.leasing import LeaseRecord
from capwatch.controller.objects import FieldOwner
from capwatch.controller.tracking import NodeState
from capwatch.controller.writes.recorder import NodeEvent


class RecordingListener:
    """A NodeListener that keeps every call, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, NodeState | str]] = []

    def node_changed(self, state: NodeState) -> None:
        self.calls.append(("changed", state))

    def node_removed(self, node: str) -> None:
        self.calls.append(("removed", node))

    @property
    def changes(self) -> list[NodeState]:
        return [state for kind, state in self.calls if isinstance(state, NodeState)]

    def clear(self) -> None:
        self.calls.clear()


def _now(clock: MonotonicClock | None) -> float:
    return asyncio.get_running_loop().time() if clock is None else clock.monotonic()


class ManualFence:
    """A Fence whose budget the test sets (0: fenced): its deadline is that many seconds
    from each reading, on ``clock`` (None: the running loop's). A refusal by the API
    server's fencing policy closes it, as a lost lease does."""

    def __init__(self, budget: float = 10.0, *, clock: MonotonicClock | None = None) -> None:
        self.budget = budget
        self.losses: list[str] = []
        self._clock = clock

    def write_deadline(self) -> float:
        if self.budget <= 0:
            return -math.inf
        return _now(self._clock) + self.budget

    def lost(self, why: str) -> None:
        self.losses.append(why)
        self.budget = 0.0


# --- conditions and Events ------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Patch:
    node: str
    condition: NodeCondition
    deadline_s: float  # the deadline it was given, less when it started
    started: float
    ended: float


class FakeConditionApi:
    """A ConditionApi holding each Node's condition. Per node, a test can script failures
    (raised in order, one per call), hold calls at a gate, or make the Node not exist."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeCondition] = {}
        self.patches: list[Patch] = []  # the successful ones, in completion order
        # (node, loop time, deadline_s: the deadline it was given, less that time)
        self.attempts: list[tuple[str, float, float]] = []
        self.failures: dict[str, list[Exception]] = defaultdict(list)  # ApiError, or a bug
        self.gates: dict[str, asyncio.Event] = {}
        self.missing: set[str] = set()
        self.cancelled: list[str] = []
        self.in_flight: dict[str, int] = defaultdict(int)
        self.most_in_flight: dict[str, int] = defaultdict(int)
        self.version = 100  # the resourceVersion the last write left (one counter for all)
        # Who else owns a node's condition: an apply is refused unless forced (and a
        # forced one takes it over).
        self.owners: dict[str, tuple[FieldOwner, ...]] = {}
        self.owner_reads: list[str] = []
        self.forced: list[bool] = []

    async def apply_condition(
        self, node: str, condition: NodeCondition, *, deadline: float, force: bool = False
    ) -> int | None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline_s = deadline - started
        self.attempts.append((node, started, deadline_s))
        self.forced.append(force)
        self.in_flight[node] += 1
        self.most_in_flight[node] = max(self.most_in_flight[node], self.in_flight[node])
        try:
            gate = self.gates.get(node)
            if gate is not None:
                await gate.wait()
            if node in self.missing:
                raise NotFound(f"nodes {node!r} not found", status=404)
            owners = self.owners.get(node, ())
            if owners and not force:
                managers = tuple(o.manager for o in owners)
                raise FieldConflict(f"conflicts with {managers}", managers=managers)
            if self.failures[node]:
                raise self.failures[node].pop(0)
            self.owners.pop(node, None)
            self.nodes[node] = condition
            self.version += 1
            self.patches.append(
                Patch(
                    node=node,
                    condition=condition,
                    deadline_s=deadline_s,
                    started=started,
                    ended=loop.time(),
                )
            )
        except asyncio.CancelledError:
            self.cancelled.append(node)
            raise
        finally:
            self.in_flight[node] -= 1
        return self.version

    async def condition_owners(self, node: str, *, deadline: float) -> tuple[FieldOwner, ...]:
        self.owner_reads.append(node)
        return self.owners.get(node, ())

    def written(self, node: str) -> list[NodeCondition]:
        return [p.condition for p in self.patches if p.node == node]


class FakeEventApi:
    """An EventApi keeping the Events it was given; failures scripted in order."""

    def __init__(self, *, clock: MonotonicClock | None = None) -> None:
        self.events: list[NodeEvent] = []
        self.deadlines: list[float] = []  # each post's deadline, less when it was made
        self._clock = clock
        self.failures: list[BaseException] = []
        self.gate: asyncio.Event | None = None

    async def create_event(self, event: NodeEvent, *, deadline: float) -> None:
        self.deadlines.append(deadline - _now(self._clock))
        if self.gate is not None:
            await self.gate.wait()
        if self.failures:
            raise self.failures.pop(0)
        self.events.append(event)

    def said(self) -> list[tuple[str, str, str]]:
        """(node, type, reason) of each Event posted."""
        return [(e.node, e.type.value, e.reason) for e in self.events]


# --- Leases ---------------------------------------------------------------------------------


class LeaseStore:
    """The API server's Leases: every write gets a new resourceVersion; create refuses an
    existing name, update refuses a stale resourceVersion (409), as the API server does."""

    def __init__(self) -> None:
        self.leases: dict[str, LeaseRecord] = {}
        self.writes: list[tuple[str, LeaseRecord, float]] = []  # (who, record, loop time)
        self._version = 0

    def save(self, who: str, name: str, record: LeaseRecord) -> LeaseRecord:
        self._version += 1
        stored = dataclasses.replace(record, resource_version=str(self._version))
        self.leases[name] = stored
        self.writes.append((who, stored, asyncio.get_running_loop().time()))
        return stored

    def writes_by(self, who: str) -> list[tuple[LeaseRecord, float]]:
        return [(record, at) for by, record, at in self.writes if by == who]

    def client(self, who: str) -> LeaseClient:
        return LeaseClient(self, who)


@dataclass
class LeaseClient:
    """One replica's connection to the LeaseStore: a test can make it fail (an ApiError),
    hang (no answer until the caller gives up) or be slow."""

    store: LeaseStore
    who: str
    down: bool = False
    hung: bool = False
    delay_s: float = 0.0
    # (verb, loop time, deadline_s) of every call
    calls: list[tuple[str, float, float]] = field(default_factory=list)
    # Run once just before this client's next create or update lands (another
    # replica's write getting there first).
    before_write: Callable[[], None] | None = None
    # A write lands at once but its answer takes this long: cancelling the caller
    # meanwhile does not undo it (the real client's request runs on a thread).
    slow_answer_s: float = 0.0

    async def _enter(self, verb: str, deadline_s: float) -> None:
        self.calls.append((verb, asyncio.get_running_loop().time(), deadline_s))
        if self.hung:
            await asyncio.Event().wait()
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.down:
            raise ApiError("service unavailable", status=503)

    async def get_lease(self, name: str, *, deadline_s: float) -> LeaseRecord | None:
        await self._enter("get", deadline_s)
        return self.store.leases.get(name)

    async def create_lease(
        self, name: str, record: LeaseRecord, *, deadline_s: float
    ) -> LeaseRecord:
        await self._enter("create", deadline_s)
        self._race()
        if name in self.store.leases:
            raise Conflict(f"leases {name!r} already exists", status=409)
        return self.store.save(self.who, name, record)

    async def update_lease(
        self, name: str, record: LeaseRecord, *, deadline_s: float
    ) -> LeaseRecord:
        await self._enter("update", deadline_s)
        self._race()
        current = self.store.leases.get(name)
        if current is None:
            raise NotFound(f"leases {name!r} not found", status=404)
        if record.resource_version != current.resource_version:
            raise Conflict("the object has been modified", status=409)
        stored = self.store.save(self.who, name, record)
        if self.slow_answer_s:
            await asyncio.sleep(self.slow_answer_s)
        return stored

    def _race(self) -> None:
        hook, self.before_write = self.before_write, None
        if hook is not None:
            hook()


# --- stream clients -------------------------------------------------------------------------

_END = object()


class FakeStream:
    """What a follower uses of a NodeHealthClient: ``events()`` yields what the test puts
    (an exception is raised from it; :meth:`end` finishes it) and ``close()``."""

    def __init__(self, node: str, address: str) -> None:
        self.node = node
        self.address = address
        self._items: asyncio.Queue[object] = asyncio.Queue()
        self.opened = False
        self.closed = False

    def put(self, event: Event) -> None:
        self._items.put_nowait(event)

    def fail(self, error: BaseException) -> None:
        self._items.put_nowait(error)

    def end(self) -> None:
        self._items.put_nowait(_END)

    async def events(self, *, since: int = 0, instance_id: str = "") -> AsyncGenerator[Event, None]:
        self.opened = True
        while True:
            item = await self._items.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield cast(Event, item)

    async def close(self) -> None:
        self.closed = True


class FakeClients:
    """A client factory keeping every stream it made."""

    def __init__(self) -> None:
        self.made: list[FakeStream] = []

    def __call__(self, node: str, address: str) -> FakeStream:
        stream = FakeStream(node, address)
        self.made.append(stream)
        return stream

    def of(self, node: str) -> list[FakeStream]:
        return [s for s in self.made if s.node == node]

    def latest(self, node: str) -> FakeStream:
        return self.of(node)[-1]
