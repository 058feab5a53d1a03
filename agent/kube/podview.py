"""The agent's pod view: this node's pods from an informer, handed out only in sync.

The informer lists and watches the pods with ``spec.nodeName=<node>`` into an
in-memory cache keyed by pod UID. :meth:`PodInformer.snapshot` hands out the
cache only while the informer is known to be in sync (its rules: the first
LIST done, requests not failing for longer than ``stale_after`` -- the agent
passes one interval -- and something delivered within the silence bound
``B``, ``--pod-silence-bound``); otherwise it raises
:class:`~capwatch.kit.errors.PodViewError`, and the cycle aborts before touching a
GPU (caps stay as they are, the cycle fails, readiness drops).

The worst case, exactly: a snapshot is handed out at time ``t`` only if the
last delivery was at or after ``t - B``, so every cycle that reports itself
enforced acted on every pod change the API server had committed more than
``B`` seconds before it (give or take the server's own watch-cache lag). A
watch that goes silent makes the first cycle starting more than ``B`` after
its last delivery abort; readiness drops with that cycle, at most ``B`` plus
one interval (and one cycle's duration) after the last delivery. The view is
synced again at the first event, bookmark or clean end after the server
delivers again.

Pods in phase Succeeded/Failed stay in the cache until deleted: their processes
are gone, so they can never own a GPU, and dropping them would only add a rule.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from capwatch.agent.kube.pod_wire import pod_info
from capwatch.agent.pods import PodInfo, PodSnapshot
from capwatch.kit.clock import Clock
from capwatch.kit.errors import PodViewError
from capwatch.kube.informer import Informer, InformerStats, ListWatchRequests, WatchPolicy
from capwatch.kube.wire import as_mapping


class _PodStore:
    """The cache the informer fills (on its thread) and snapshots read."""

    def __init__(self, on_new_pod: Callable[[], None] | None) -> None:
        self.lock = threading.Lock()
        self.pods: dict[str, PodInfo] = {}
        self.published: PodSnapshot | None = None  # None: rebuild on the next snapshot
        self._on_new_pod = on_new_pod

    def replace(self, objects: list[Mapping[str, Any]]) -> None:
        pods = {info.ref.uid: info for obj in objects if (info := pod_info(obj)) is not None}
        with self.lock:
            new = bool(pods.keys() - self.pods.keys())
            self.pods = pods
            self.published = None
        if new and self._on_new_pod is not None:
            self._on_new_pod()

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        new = False
        with self.lock:
            if kind == "DELETED":
                self.pods.pop(str(as_mapping(obj.get("metadata")).get("uid") or ""), None)
            elif (info := pod_info(obj)) is not None:
                new = info.ref.uid not in self.pods
                self.pods[info.ref.uid] = info
            self.published = None
        if new and self._on_new_pod is not None:
            self._on_new_pod()  # a pod just bound here: its cap before its first process


class PodInformer:
    """A :class:`~capwatch.agent.pods.PodView` kept current by list+watch in a daemon thread."""

    def __init__(
        self,
        *,
        node_name: str,
        requests: ListWatchRequests,
        clock: Clock,
        policy: WatchPolicy,
        rng: random.Random | None = None,
        on_new_pod: Callable[[], None] | None = None,
    ) -> None:
        """``on_new_pod``: called (on the informer's thread) when a pod the view did not
        hold arrives: the agent's :class:`~capwatch.agent.nudge.Nudge`."""
        if not node_name:
            raise ValueError("node_name must not be empty")
        self._node = node_name
        self._store = _PodStore(on_new_pod)
        self._informer = Informer(
            what=f"pods on node {node_name}",
            requests=requests,
            store=self._store,
            clock=clock,
            policy=policy,
            rng=rng,
        )

    def start(self) -> None:
        """Start the list+watch thread. Calling it twice is an error."""
        self._informer.start(f"capwatch-podview-{self._node}")

    def close(self) -> None:
        """Stop the thread, cutting an open watch (see :meth:`Informer.close`)."""
        self._informer.close()

    def snapshot(self) -> PodSnapshot:
        """The cache, while it is known to be in sync."""
        if self._informer.closed:
            raise PodViewError("pod view is closed")
        problem = self._informer.sync_problem()
        if problem is not None:
            raise PodViewError(f"pod view {problem}")
        store, version = self._store, self._informer.resource_version
        with store.lock:
            # A bookmark moves the resourceVersion without touching the pods.
            if store.published is None or store.published.resource_version != version:
                store.published = PodSnapshot(
                    pods=MappingProxyType(dict(store.pods)), resource_version=version
                )
            return store.published

    def stats(self) -> InformerStats:
        return self._informer.stats()
