"""The cluster stream's state: every node of the shard, and a sequenced feed of changes.

A :class:`~capwatch.controller.tracking.NodeListener`: each node change whose
:func:`~capwatch.controller.cluster.mapping.change_key` differs from the last one published
becomes one ``NodeUpdate``, numbered, encoded once (``WatchResponse`` bytes)
and published into a :class:`~capwatch.kit.broadcast.Broadcast` that every Watch
stream follows at its own pace. A cycle that changes nothing a subscriber is
shown (its sequence number, its age) publishes nothing: at 5,000 nodes and a
15 s interval that is the difference between 333 updates a second and the
handful of real changes. Snapshots are built from the current states, with
ages measured when they are sent.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from capwatch.api.gen.capwatch.v1 import cluster_health_pb2 as cpb
from capwatch.controller.cluster import mapping
from capwatch.controller.tracking import NodeState
from capwatch.kit.broadcast import Broadcast
from capwatch.kit.clock import Clock

DEFAULT_CAPACITY = 4096  # updates kept for resuming subscribers
# Nodes per snapshot message: 1,000 nodes of 8 GPUs is about 0.9 MB, well under
# grpc's default 4 MiB receive limit, whatever the shard's size.
PAGE_SIZE = 1000


class ClusterView:
    def __init__(self, *, clock: Clock, capacity: int = DEFAULT_CAPACITY) -> None:
        self.instance_id = str(uuid.uuid4())  # new per start: sequences restart with it
        self._clock = clock
        # Which shard this is, and who leads it (set by the composition root).
        self.shard: Callable[[], cpb.Shard] = cpb.Shard
        self._states: dict[str, NodeState] = {}
        self._keys: dict[str, tuple[object, ...]] = {}
        self.broadcast: Broadcast[bytes] = Broadcast(capacity=capacity)

    @property
    def sequence(self) -> int:
        return self.broadcast.sequence

    def __len__(self) -> int:
        return len(self._states)

    def node_changed(self, state: NodeState) -> None:
        node = state.node
        self._states[node] = state
        key = mapping.change_key(state)
        if self._keys.get(node) == key:
            return
        self._keys[node] = key
        self._publish(mapping.node_health(state, now=self._clock.monotonic()), removed=False)

    def node_removed(self, node: str) -> None:
        self._states.pop(node, None)
        if self._keys.pop(node, None) is not None:
            self._publish(cpb.NodeHealth(node_name=node), removed=True)

    def snapshot(
        self, *, resync: bool = False, page_size: int = PAGE_SIZE
    ) -> list[cpb.ClusterSnapshot]:
        """Every node now, in pages of ``page_size`` (``more`` on all but the last); at least
        one page, so an empty shard still says so."""
        states = sorted(self._states.values(), key=lambda s: s.node)
        return [
            self._page(states[i : i + page_size], resync=resync, more=i + page_size < len(states))
            for i in range(0, max(1, len(states)), page_size)
        ]

    def page(self, *, after: str, page_size: int) -> tuple[cpb.ClusterSnapshot, str]:
        """The nodes named after ``after`` (by name), at most ``page_size``, and the name to
        go on after ("" when there are none left)."""
        names = sorted(n for n in self._states if n > after)
        chosen = names[:page_size]
        last = chosen[-1] if len(names) > page_size else ""
        return self._page([self._states[n] for n in chosen], resync=False, more=False), last

    def _page(self, states: list[NodeState], *, resync: bool, more: bool) -> cpb.ClusterSnapshot:
        return mapping.snapshot(
            states,
            now=self._clock.monotonic(),
            wall=self._clock.wall(),
            instance_id=self.instance_id,
            sequence=self.sequence,
            shard_info=self.shard(),
            resync=resync,
            more=more,
        )

    def heartbeat(self) -> cpb.ClusterHeartbeat:
        message = cpb.ClusterHeartbeat(
            last_sequence=self.sequence,
            controller_instance_id=self.instance_id,
            shard=self.shard(),
        )
        message.time.FromNanoseconds(int(self._clock.wall() * 1e9))
        return message

    def close(self) -> None:
        self.broadcast.close()

    def _publish(self, node: cpb.NodeHealth, *, removed: bool) -> None:
        sequence = self.sequence + 1
        update = cpb.NodeUpdate(sequence=sequence, node=node, removed=removed)
        self.broadcast.publish(
            sequence, cpb.ClusterHealthServiceWatchResponse(update=update).SerializeToString()
        )
