"""The agent's claims view: the DRA ResourceClaims and ResourceSlices that cap this node.

Two informers (:mod:`agent.kube.informer`, so a steady cycle makes no request): the
ResourceClaims (every namespace, or the release's with a namespaced Role: a claim has
no field a selector could pick this node by), of which only those with an allocation
are kept, and this node's ResourceSlices (``spec.nodeName=<node>``). The snapshot a
cycle reads is :func:`agent.claims.claims_snapshot` of the two, rebuilt only when
either changed; it is handed out only while both informers are in sync, else
:class:`~kit.errors.PodViewError` aborts the cycle, as the pod view does (a cycle
that cannot see the claims might write a GPU the annotation's or the safe default's
cap where a claim asked another).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Mapping
from typing import Any

from agent.claims import DEFAULT_UUID_ATTRIBUTE, ClaimsSnapshot, claims_snapshot
from agent.kube.informer import Informer, ListWatchRequests, WatchPolicy
from agent.kube.wire import as_mapping
from kit.clock import Clock
from kit.errors import PodViewError

RESOURCE_API = "/apis/resource.k8s.io/v1"
SLICES_PATH = f"{RESOURCE_API}/resourceslices"


def claims_path(namespace: str | None) -> str:
    """Every namespace's ResourceClaims, or one namespace's (a namespaced Role)."""
    where = "" if namespace is None else f"/namespaces/{namespace}"
    return f"{RESOURCE_API}{where}/resourceclaims"


class _Objects:
    """One informer's cache: raw objects by UID, those ``keep`` accepts. ``on_change``
    is told (with the lock held) the object before and after each change."""

    def __init__(
        self,
        lock: threading.Lock,
        on_change: Callable[[Mapping[str, Any] | None, Mapping[str, Any] | None], None],
        keep: Callable[[Mapping[str, Any]], bool],
        after: Callable[[], None],
    ) -> None:
        self._lock = lock
        self._on_change = on_change
        self._keep = keep
        self._after = after  # once the lock is let go
        self.objects: dict[str, Mapping[str, Any]] = {}

    def replace(self, objects: list[Mapping[str, Any]]) -> None:
        kept = {_uid(o): o for o in objects if self._keep(o)}
        with self._lock:
            before, self.objects = self.objects, kept
            for uid in before.keys() | kept.keys():
                if before.get(uid) != kept.get(uid):
                    self._on_change(before.get(uid), kept.get(uid))
        self._after()

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        uid = _uid(obj)
        with self._lock:
            old = self.objects.get(uid)
            if kind == "DELETED" or not self._keep(obj):
                if self.objects.pop(uid, None) is None:
                    return
                self._on_change(old, None)
            else:
                self.objects[uid] = obj
                self._on_change(old, obj)
        self._after()


def _uid(obj: Mapping[str, Any]) -> str:
    return str(as_mapping(obj.get("metadata")).get("uid") or "")


def _allocated(claim: Mapping[str, Any]) -> bool:
    return bool(as_mapping(claim.get("status")).get("allocation"))


def _pool(item: Mapping[str, Any]) -> tuple[str, str]:
    spec = as_mapping(item.get("spec"))
    return (str(spec.get("driver") or ""), str(as_mapping(spec.get("pool")).get("name") or ""))


def _in_pools(claim: Mapping[str, Any], pools: set[tuple[str, str]]) -> bool:
    devices = as_mapping(
        as_mapping(as_mapping(claim.get("status")).get("allocation")).get("devices")
    )
    results = devices.get("results")
    return any(
        (str(r.get("driver") or ""), str(r.get("pool") or "")) in pools
        for r in (results if isinstance(results, list) else [])
        if isinstance(r, Mapping)
    )


class ClaimInformer:
    """A :class:`~agent.claims.ClaimView` kept current by two list+watch threads."""

    def __init__(
        self,
        *,
        node_name: str,
        claims: ListWatchRequests,
        slices: ListWatchRequests,
        clock: Clock,
        policy: WatchPolicy,
        uuid_attribute: str = DEFAULT_UUID_ATTRIBUTE,
        rng: random.Random | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        """``on_change``: called (on an informer's thread) when a claim allocated in a
        pool of this node, or this node's slices, changed: the agent's
        :class:`~agent.nudge.Nudge`. Claims of other nodes change nothing here."""
        self._node = node_name
        self._attribute = uuid_attribute
        self._lock = threading.Lock()
        self._published: ClaimsSnapshot | None = None  # None: rebuild on the next snapshot
        self._notify = on_change
        self._dirty = False  # a change on_change must hear of, once the lock is let go
        self._claims = _Objects(self._lock, self._claim_changed, _allocated, self._told)
        self._slices = _Objects(self._lock, self._slice_changed, lambda _: True, self._told)
        self._informers = (
            Informer(
                what="resource claims",
                requests=claims,
                store=self._claims,
                clock=clock,
                policy=policy,
                rng=rng,
            ),
            Informer(
                what=f"resource slices of node {node_name}",
                requests=slices,
                store=self._slices,
                clock=clock,
                policy=policy,
                rng=rng,
            ),
        )

    # Called with the lock held: mark, and tell on_change once the lock is let go.
    def _claim_changed(self, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> None:
        self._published = None
        pools = {_pool(item) for item in self._slices.objects.values()}
        if any(_in_pools(claim, pools) for claim in (old, new) if claim is not None):
            self._dirty = True

    def _slice_changed(self, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> None:
        self._published = None
        self._dirty = True

    def _told(self) -> None:
        with self._lock:
            dirty, self._dirty = self._dirty, False
        if dirty and self._notify is not None:
            self._notify()

    def start(self) -> None:
        claims, slices = self._informers
        claims.start(f"capwatch-claims-{self._node}")
        slices.start(f"capwatch-slices-{self._node}")

    def close(self) -> None:
        for informer in self._informers:
            informer.close()

    def snapshot(self) -> ClaimsSnapshot:
        for informer in self._informers:
            if informer.closed:
                raise PodViewError("claims view is closed")
            problem = informer.sync_problem()
            if problem is not None:
                raise PodViewError(f"claims view {problem}")
        with self._lock:
            if self._published is None:
                self._published = claims_snapshot(
                    list(self._claims.objects.values()),
                    list(self._slices.objects.values()),
                    node=self._node,
                    uuid_attribute=self._attribute,
                )
            return self._published
