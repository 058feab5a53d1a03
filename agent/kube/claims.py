"""The agent's claims view: the ResourceClaims this node's pods use, and its ResourceSlices.

Read as the kubelet reads them, never cluster-wide:

- **claims by name.** The pod view already holds this node's pods, and each pod
  names its claims (:func:`capwatch.agent.kube.pod_wire.pod_claims`). A claim is fetched with
  one GET when a pod of this node first uses it (and again when another pod does),
  then kept while some pod of the node still uses it: a claim's spec never changes
  and its allocation is written before its pod is bound. A steady cycle makes no
  request; 20,000 claims of other nodes cost nothing here. RBAC: ``get``.
- **this node's slices** by list+watch with ``fieldSelector=spec.nodeName=<node>``
  (:mod:`capwatch.kube.informer`). A cycle that cannot trust them aborts before touching
  a GPU, as with the pod view.

A claim that cannot be read (not found, not allocated, the request failed) is not
an abort: it is a named failure of the cycle and its pods' GPUs keep their caps
(:mod:`capwatch.agent.dra.claims`), and it is read again next cycle.

resource.k8s.io/v1 may not be served (before Kubernetes 1.34, or switched off), or
may start or stop being served while the agent runs: when it is not, no slice is
watched and no claim read, and any claim a pod names is a named failure; the group
is asked about again every ``recheck_s`` and the slices' watch starts when it is
served. Each change is one log line.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from capwatch.agent.dra.claims import (
    ClaimKey,
    ClaimsSnapshot,
    Pin,
    ReadClaim,
    allocated,
    claims_snapshot,
    referenced_claims,
)
from capwatch.agent.dra.slices import DEFAULT_UUID_ATTRIBUTE, NodeDevices, node_devices
from capwatch.agent.pods import PodSnapshot
from capwatch.kit.clock import Clock
from capwatch.kit.errors import CapwatchError, PodViewError
from capwatch.kube.informer import Informer, ListWatchRequests, WatchPolicy
from capwatch.kube.wire import ApiStatusError, as_mapping

log = logging.getLogger(__name__)

RESOURCE_API = "/apis/resource.k8s.io/v1"
SLICES_PATH = f"{RESOURCE_API}/resourceslices"
NOT_FOUND = 404
RECHECK_S = 60.0
# A claim is read inside a cycle: each GET (and the served check) is bounded by this
# or the interval, whichever is shorter.
CLAIM_READ_TIMEOUT_S = 5.0


def claim_path(namespace: str, name: str) -> str:
    return f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{name}"


class ObjectReader(Protocol):
    def get(self, path: str) -> Mapping[str, Any]:
        """The object at path. Raises ApiStatusError on an HTTP error status, and another
        CapwatchError when no answer came."""
        ...


class _Slices:
    """The slices informer's cache (by UID); ``on_change`` is told after each change."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        self.lock = threading.Lock()
        self.objects: dict[str, Mapping[str, Any]] = {}
        self.version = 0  # bumped on every change: the devices are rebuilt on the next read
        self._on_change = on_change

    def replace(self, objects: list[Mapping[str, Any]]) -> None:
        kept = {_uid(o): o for o in objects}
        with self.lock:
            changed = kept != self.objects
            self.objects = kept
            self.version += changed
        if changed:
            self._on_change()

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        uid = _uid(obj)
        with self.lock:
            if kind == "DELETED":
                if self.objects.pop(uid, None) is None:
                    return
            else:
                self.objects[uid] = obj
            self.version += 1
        self._on_change()


def _uid(obj: Mapping[str, Any]) -> str:
    return str(as_mapping(obj.get("metadata")).get("uid") or "")


class _State(str, Enum):
    UNKNOWN = "unknown"
    SERVED = "served"
    NOT_SERVED = "not_served"


@dataclass(frozen=True, kw_only=True)
class _Held:
    """A claim read and allocated, and the pods (by uid) that used it when it was read."""

    obj: Mapping[str, Any]
    pods: frozenset[str]


class NodeClaims:
    """A :class:`~capwatch.agent.dra.claims.ClaimView` over the API server (see the module
    docstring).

    ``served`` asks whether resource.k8s.io/v1 is served (True, False, or None when it
    cannot tell: taken as served). ``on_change`` is the agent's
    :class:`~capwatch.agent.nudge.Nudge`, told when this node's slices change.
    """

    def __init__(
        self,
        *,
        node_name: str,
        slices: ListWatchRequests,
        objects: ObjectReader,
        served: Callable[[], bool | None],
        clock: Clock,
        policy: WatchPolicy,
        uuid_attribute: str = DEFAULT_UUID_ATTRIBUTE,
        rng: random.Random | None = None,
        on_change: Callable[[], None] | None = None,
        recheck_s: float = RECHECK_S,
    ) -> None:
        self._node = node_name
        self._requests = slices
        self._objects = objects
        self._served = served
        self._clock = clock
        self._policy = policy
        self._attribute = uuid_attribute
        self._rng = rng
        self._notify = on_change
        self._recheck_s = recheck_s
        self._slices = _Slices(self._changed)
        self._informer: Informer | None = None
        self._state = _State.UNKNOWN
        self._checked_at: float | None = None
        self._held: dict[ClaimKey, _Held] = {}
        self._pins: Mapping[Pin, str] = {}
        self._devices: tuple[int, NodeDevices] | None = None
        self._closed = False
        self.requests = 0  # claim GETs made, for benchmarks and tests

    def _changed(self) -> None:
        if self._notify is not None:
            self._notify()

    # -- resource.k8s.io served or not ------------------------------------------------

    def start(self) -> None:
        self._check_served()

    def _check_served(self) -> None:
        self._checked_at = self._clock.monotonic()
        if self._served() is False:
            if self._state is not _State.NOT_SERVED:
                if self._state is _State.SERVED:
                    log.warning(
                        "%s is no longer served: no claim is read until it is", RESOURCE_API
                    )
                else:
                    log.warning(
                        "%s is not served by this API server: caps come from pod annotations "
                        "(asked again every %gs)",
                        RESOURCE_API,
                        self._recheck_s,
                    )
                if self._informer is not None:
                    self._informer.close()
                    self._informer = None
                self._slices.replace([])
                self._state = _State.NOT_SERVED
            return
        if self._state is not _State.SERVED:
            if self._state is _State.NOT_SERVED:
                log.info("%s is served now: reading this node's claims and slices", RESOURCE_API)
            self._informer = Informer(
                what=f"resource slices of node {self._node}",
                requests=self._requests,
                store=self._slices,
                clock=self._clock,
                policy=self._policy,
                rng=self._rng,
            )
            self._informer.start(f"capwatch-slices-{self._node}")
            self._state = _State.SERVED

    @property
    def served(self) -> bool:
        """Whether the view reads claims now (resource.k8s.io/v1 served when last asked)."""
        return self._informer is not None

    # -- the cycle's read ---------------------------------------------------------------

    def snapshot(self, pods: PodSnapshot) -> ClaimsSnapshot:
        if self._closed:
            raise PodViewError("claims view is closed")
        self._recheck()
        using = referenced_claims(pods)
        for key in self._held.keys() - using.keys():
            del self._held[key]
        devices = self._node_devices()
        reads = [self._read(key, refs) for key, refs in sorted(using.items())]
        snapshot = claims_snapshot(reads, using, devices, pins=self._pins)
        self._pins = snapshot.pins
        return snapshot

    def _recheck(self) -> None:
        """Ask again whether the group is served: every recheck_s while it is not, and
        while it is, when the slices' requests answer 404."""
        due = (
            self._checked_at is None
            or self._clock.monotonic() - self._checked_at >= self._recheck_s
        )
        informer = self._informer
        if due and (informer is None or informer.failing_status == NOT_FOUND):
            self._check_served()

    def _node_devices(self) -> NodeDevices:
        informer = self._informer
        if informer is not None:
            if informer.closed:
                raise PodViewError("claims view is closed")
            problem = informer.sync_problem()
            if problem is not None:
                raise PodViewError(f"resource slices {problem}")
        with self._slices.lock:
            version, objects = self._slices.version, list(self._slices.objects.values())
        if self._devices is None or self._devices[0] != version:
            # Rebuilt only when the slices changed: a steady cycle reuses them.
            built = node_devices(objects, node=self._node, uuid_attribute=self._attribute)
            self._devices = (version, built)
        return self._devices[1]

    def _read(self, key: ClaimKey, refs: tuple[Any, ...]) -> ReadClaim:
        uids = frozenset(ref.uid for ref in refs)
        held = self._held.get(key)
        if held is not None and uids <= held.pods:
            return ReadClaim(key=key, obj=held.obj)
        if self._informer is None:
            return ReadClaim(key=key, obj=None, problem=f"{RESOURCE_API} is not served")
        self.requests += 1
        try:
            obj = self._objects.get(claim_path(*key))
        except ApiStatusError as err:
            why = "not found" if err.status == NOT_FOUND else f"cannot be read: {err}"
            return ReadClaim(key=key, obj=None, problem=why)
        except CapwatchError as err:
            return ReadClaim(key=key, obj=None, problem=f"cannot be read: {err}")
        if not allocated(obj):
            return ReadClaim(key=key, obj=None, problem="not allocated")
        self._held[key] = _Held(obj=obj, pods=uids | (held.pods if held else frozenset()))
        return ReadClaim(key=key, obj=obj)

    def close(self) -> None:
        self._closed = True
        if self._informer is not None:
            self._informer.close()
