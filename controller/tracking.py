"""The per-node state machine: discovery and stream events in, conditions out.

A node is tracked while it is a GPU node (the node watch) or has an agent
target (the agent pod watch, or the static targets file). Its
:class:`~capwatch.controller.conditions.NodeObservation` changes on:

- discovery: a target appears (``connecting``), moves, or goes (``missing``);
- the stream: a snapshot or cycle (``connected``, the latest cycle), a
  disconnect (``unreachable``, failing closed until the agent answers again);
- time: a timer per node fires when its latest cycle passes the agent's
  staleness bound, so a hung agent reads ``CycleStale`` without waiting for
  its next message; and when an agent has said nothing within
  :data:`CONNECT_GRACE_S` of becoming known, it is ``unreachable``.

``connecting`` is the controller's own ignorance (it has just started, or an
agent pod just appeared), not news about the node: the writer does not write
it, so a controller restart does not rewrite every Node with a transient
Unknown. Within the grace period the stream either answers or fails.

Each change is handed to every :class:`NodeListener` as a frozen
:class:`NodeState` (observation, condition, and when the cycle behind it ended,
for detection latency). Runs on one event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import grpc

from capwatch.client.stream_events import Cycle, Disconnected, Event, Heartbeat, Snapshot
from capwatch.controller.conditions import AgentLink, Condition, NodeObservation, condition_of
from capwatch.controller.reading import cycle_age, cycle_summary, gpu_summaries, merged, sharing
from capwatch.kit.clock import Clock

log = logging.getLogger(__name__)

CONNECT_GRACE_S = 30.0


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeState:
    observation: NodeObservation
    condition: Condition
    # Monotonic instant the cycle that produced this state ended (None: not a cycle).
    cycle_end_at: float | None = None

    @property
    def node(self) -> str:
        return self.observation.node


class NodeListener(Protocol):
    def node_changed(self, state: NodeState) -> None: ...

    def node_removed(self, node: str) -> None: ...


class NodeTracker:
    def __init__(
        self,
        *,
        clock: Clock,
        listeners: Sequence[NodeListener] = (),
        connect_grace_s: float = CONNECT_GRACE_S,
    ) -> None:
        self._clock = clock
        self._connect_grace_s = connect_grace_s
        self._listeners = list(listeners)
        self._states: dict[str, NodeState] = {}
        self._gpu_nodes: set[str] = set()
        self._targets: dict[str, str] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        # Nodes whose stream answers for another node: nothing it says counts.
        self._misdirected: set[str] = set()

    def add_listener(self, listener: NodeListener) -> None:
        self._listeners.append(listener)

    def states(self) -> Mapping[str, NodeState]:
        return dict(self._states)

    def get(self, node: str) -> NodeState | None:
        return self._states.get(node)

    def __len__(self) -> int:
        return len(self._states)

    # --- discovery -----------------------------------------------------------------------

    def gpu_node(self, node: str, *, present: bool) -> None:
        """The node watch saw ``node`` appear (or stay) as a GPU node, or go."""
        if present:
            self._gpu_nodes.add(node)
            if node not in self._states:
                self._update(NodeObservation(node=node, link=AgentLink.MISSING))
            return
        self._gpu_nodes.discard(node)
        if node not in self._targets:
            self._remove(node)

    def target(self, node: str, address: str | None) -> None:
        """The agent for ``node`` is at ``address`` (None: there is no agent any more)."""
        current = self._states.get(node)
        if address is None:
            self._misdirected.discard(node)
            self._targets.pop(node, None)
            if node not in self._gpu_nodes:
                self._remove(node)
            elif current is not None:
                self._update(NodeObservation(node=node, link=AgentLink.MISSING))
            return
        self._targets[node] = address
        if current is None or current.observation.address != address:
            # A new agent (or one that moved): nothing it says is known yet.
            self._misdirected.discard(node)
            self._update(NodeObservation(node=node, link=AgentLink.CONNECTING, address=address))

    def targets(self) -> Mapping[str, str]:
        return dict(self._targets)

    def target_of(self, node: str) -> str | None:
        return self._targets.get(node)

    # --- the stream ----------------------------------------------------------------------

    def on_event(self, node: str, event: Event) -> None:
        """Apply one event of ``node``'s stream (ignored if the node is not tracked)."""
        state = self._states.get(node)
        if state is None:
            return
        seen = state.observation
        if isinstance(event, Snapshot):
            self._on_snapshot(seen, event)
        elif isinstance(event, Cycle):
            self._on_cycle(seen, event)
        elif isinstance(event, Disconnected):
            self._on_disconnected(seen, event)
        elif (
            isinstance(event, Heartbeat)
            and seen.link is not AgentLink.CONNECTED
            and seen.node not in self._misdirected
        ):
            self._update(
                replace(seen, link=AgentLink.CONNECTED, link_error="", link_malformed=False)
            )

    def _on_snapshot(self, seen: NodeObservation, event: Snapshot) -> None:
        snapshot = event.snapshot
        if snapshot.node_name and snapshot.node_name != seen.node:
            error = f"the agent there answers for node {snapshot.node_name!r}"
            log.warning("refusing a misdirected stream node=%s %s", seen.node, error)
            self._misdirected.add(seen.node)
            self._update(
                replace(
                    seen,
                    link=AgentLink.UNREACHABLE,
                    link_error=error,
                    link_malformed=False,
                    cycle=None,
                )
            )
            return
        self._misdirected.discard(seen.node)
        gpus = gpu_summaries(snapshot.devices)
        cycle = None
        if snapshot.HasField("last_cycle"):
            cycle = cycle_summary(
                snapshot.last_cycle,
                devices=snapshot.last_cycle.devices,
                age_s=cycle_age(snapshot.readiness),
                received_at=event.received_at,
            )
        self._update(
            replace(
                seen,
                link=AgentLink.CONNECTED,
                link_error="",
                link_malformed=False,
                instance_id=snapshot.agent_instance_id,
                stale_after_s=snapshot.stale_after.ToTimedelta().total_seconds() or None,
                cycle=None if cycle is None else sharing(cycle, gpus),
                gpus=gpus,
            ),
            cycle_end_at=None if cycle is None else cycle.finished_at,
        )

    def _on_cycle(self, seen: NodeObservation, event: Cycle) -> None:
        if seen.node in self._misdirected:
            return
        cycle = cycle_summary(
            event.cycle,
            devices=event.cycle.devices,
            age_s=cycle_age(event.cycle.readiness),
            received_at=event.received_at,
        )
        gpus = merged(seen.gpus, cycle.gpus)
        self._update(
            replace(
                seen,
                link=AgentLink.CONNECTED,
                link_error="",
                link_malformed=False,
                cycle=sharing(cycle, gpus),
                gpus=gpus,
            ),
            cycle_end_at=cycle.finished_at,
        )

    def _on_disconnected(self, seen: NodeObservation, event: Disconnected) -> None:
        error = event.error
        if event.code is grpc.StatusCode.FAILED_PRECONDITION:
            error = f"refused: {error}"
        self._update(
            replace(
                seen,
                link=AgentLink.UNREACHABLE,
                link_error=error,
                link_malformed=event.malformed,
            )
        )

    # --- time ----------------------------------------------------------------------------

    def recheck(self, node: str) -> None:
        """Re-derive ``node``'s condition now (its timer fired)."""
        timer = self._timers.pop(node, None)
        if timer is not None:
            timer.cancel()  # called directly, before it fired: _update arms a new one
        state = self._states.get(node)
        if state is None:
            return
        seen = state.observation
        if seen.link is AgentLink.CONNECTING:
            error = f"no answer within {self._connect_grace_s:g}s"
            self._update(replace(seen, link=AgentLink.UNREACHABLE, link_error=error))
        else:
            self._update(seen)

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    # --- internals -----------------------------------------------------------------------

    def _update(self, observation: NodeObservation, *, cycle_end_at: float | None = None) -> None:
        node = observation.node
        now = self._clock.monotonic()
        state = NodeState(
            observation=observation,
            condition=condition_of(observation, now),
            cycle_end_at=cycle_end_at,
        )
        previous = self._states.get(node)
        self._states[node] = state
        self._arm(observation, now)
        if previous is not None and previous == state:
            return
        for listener in self._listeners:
            listener.node_changed(state)

    def _arm(self, observation: NodeObservation, now: float) -> None:
        node = observation.node
        timer = self._timers.pop(node, None)
        if timer is not None:
            timer.cancel()
        if observation.link is AgentLink.CONNECTING:
            self._timers[node] = asyncio.get_running_loop().call_later(
                self._connect_grace_s, self.recheck, node
            )
            return
        cycle, bound = observation.cycle, observation.stale_after_s
        if observation.link is not AgentLink.CONNECTED or cycle is None or bound is None:
            return
        remaining = cycle.finished_at + bound - now
        if remaining <= 0:
            return  # already stale: the condition says so
        self._timers[node] = asyncio.get_running_loop().call_later(
            remaining + 0.001, self.recheck, node
        )

    def _remove(self, node: str) -> None:
        timer = self._timers.pop(node, None)
        if timer is not None:
            timer.cancel()
        self._misdirected.discard(node)
        if self._states.pop(node, None) is not None:
            for listener in self._listeners:
                listener.node_removed(node)
