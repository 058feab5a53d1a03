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

CLAIMS_PATH = "/apis/resource.k8s.io/v1/resourceclaims"
SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"


class _Objects:
    """One informer's cache: raw objects by UID, those ``keep`` accepts."""

    def __init__(
        self,
        lock: threading.Lock,
        on_change: Callable[[], None],
        keep: Callable[[Mapping[str, Any]], bool],
    ) -> None:
        self._lock = lock
        self._on_change = on_change
        self._keep = keep
        self.objects: dict[str, Mapping[str, Any]] = {}

    def replace(self, objects: list[Mapping[str, Any]]) -> None:
        kept = {_uid(o): o for o in objects if self._keep(o)}
        with self._lock:
            self.objects = kept
            self._on_change()

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        uid = _uid(obj)
        with self._lock:
            if kind == "DELETED" or not self._keep(obj):
                if self.objects.pop(uid, None) is None:
                    return
            else:
                self.objects[uid] = obj
            self._on_change()


def _uid(obj: Mapping[str, Any]) -> str:
    return str(as_mapping(obj.get("metadata")).get("uid") or "")


def _allocated(claim: Mapping[str, Any]) -> bool:
    return bool(as_mapping(claim.get("status")).get("allocation"))


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
    ) -> None:
        self._node = node_name
        self._attribute = uuid_attribute
        self._lock = threading.Lock()
        self._published: ClaimsSnapshot | None = None  # None: rebuild on the next snapshot
        self._claims = _Objects(self._lock, self._changed, _allocated)
        self._slices = _Objects(self._lock, self._changed, lambda _: True)
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

    def _changed(self) -> None:
        self._published = None  # called with the lock held

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
