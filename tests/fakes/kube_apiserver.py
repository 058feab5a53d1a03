"""An in-process fake Kubernetes API server that speaks the real wire format.

A real HTTP/1.1 server on 127.0.0.1 (ephemeral port) in a background thread,
serving, in JSON, the endpoints the real ``kubernetes`` client calls for
capwatch's agent and controller (routes in kube_http):

- pods: ``GET /api/v1/pods`` and ``/api/v1/namespaces/{ns}/pods``, list and
  watch, by field and label selector (kube_pods, kube_lists, kube_watch);
- nodes: list, watch, get, and the strategic-merge / JSON-merge / JSON PATCH of
  ``/status`` (kube_nodes, kube_patch);
- leases: ``coordination.k8s.io/v1`` get, list, create and update with real
  optimistic concurrency (kube_leases);
- events: ``POST /api/v1/namespaces/{ns}/events``, and list and watch of
  them, cluster-wide or in a namespace, by field selector (kube_events);
- DRA: ``resource.k8s.io/v1`` ResourceClaims and ResourceSlices, list and
  watch, and the group version's discovery (kube_resources); ``resource_api=False``
  makes a server without them (before 1.34).

What it answers is held to a real kube-apiserver: the contract tests in
tests/kube/test_fake_*.py run against both (tests/kube/servers.py).

All of it shares one resourceVersion sequence and lock (kube_store). Lists
page with ``limit``/``continue`` over a consistent snapshot and read
``resourceVersion``/``resourceVersionMatch`` as the real server does
(kube_lists); watches replay from ``resourceVersion``, send BOOKMARKs as the
real watch cache does and end after ``timeoutSeconds``. A resourceVersion
older than the retained history is answered 410 Gone: as an ERROR event
carrying a ``Status`` (``gone_mode`` "event", what a real 1.37 server
sends), or as an HTTP 410 ("http"). Failures are ``Status`` objects.

Tests drive it through the methods below: write pods and nodes, seed and read
Leases, read Events and the write logs (who wrote which Node status while
which Lease was held), emit bookmarks, compact history, inject failures for
everyone (kube_faults: by request kind and method, 429 with Retry-After,
500, in-stream errors, hangs) or cut one client off by its User-Agent,
delay answers' bodies after their headers, drop/end/stall watch streams,
and read the request log.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeVar

from tests.fakes.kube_events import EventStore, EventWrite
from tests.fakes.kube_faults import Faults, RequestKind, RequestRecord
from tests.fakes.kube_http import Handler, Server
from tests.fakes.kube_leases import LeaseState, LeaseStore, LeaseWrite
from tests.fakes.kube_nodes import Node, NodeStatusWrite, NodeStore
from tests.fakes.kube_pods import Pod, PodStore
from tests.fakes.kube_resources import ClaimStore, SliceStore, TaintRuleStore
from tests.fakes.kube_store import Key, Obj, ResourceVersions
from tests.fakes.kube_watch import WatchControls

__all__ = ["FakeKubeApiServer", "GoneMode", "RequestKind", "RequestRecord"]

_S = TypeVar("_S", ClaimStore, SliceStore)

GoneMode = Literal["http", "event"]


class FakeKubeApiServer:
    """The fake API server. ``start()`` before use, ``stop()`` after."""

    def __init__(
        self,
        *,
        gone_mode: GoneMode = "event",
        history_limit: int = 1000,
        bookmark_frequency: float = 60.0,
        resource_api: bool = True,
    ) -> None:
        self.versions = ResourceVersions()
        self.pods = PodStore(versions=self.versions, history_limit=history_limit)
        self.store = self.pods  # the name from when pods were all there was
        self.nodes = NodeStore(versions=self.versions, history_limit=history_limit)
        self.leases = LeaseStore(versions=self.versions, history_limit=history_limit)
        self.events_store = EventStore(versions=self.versions, history_limit=history_limit)
        self.claims: ClaimStore | None = None
        self.slices: SliceStore | None = None
        self.taint_rules: TaintRuleStore | None = None
        if resource_api:
            self.claims = ClaimStore(versions=self.versions, history_limit=history_limit)
            self.slices = SliceStore(versions=self.versions, history_limit=history_limit)
            self.taint_rules = TaintRuleStore(versions=self.versions, history_limit=history_limit)
        # Whether resource.k8s.io/v1 answers now (serve_resource_api): a cluster upgraded,
        # or the group switched off, while its clients run.
        self.resource_served = resource_api
        self.faults = Faults(cond=self.versions.cond)
        self.watch_controls = WatchControls()
        self.gone_mode: GoneMode = gone_mode
        # Seconds between the periodic BOOKMARKs of a watch that allows them.
        self.bookmark_frequency = bookmark_frequency
        # Seconds between an answer's headers and its body (delay_bodies).
        self.body_delay = 0.0
        self._stop = threading.Event()
        self._httpd: Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------

    def start(self) -> None:
        handler = type("BoundHandler", (Handler,), {"fake": self})
        self._httpd = Server(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-kube-apiserver",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and cut open watches, hung requests and cut-off hangs. Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        with self.versions.cond:
            self.watch_controls.stopping = True
            self.versions.cond.notify_all()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def url(self) -> str:
        assert self._httpd is not None, "server not started"
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    # -- pods -------------------------------------------------------------------

    def add_pod(
        self,
        namespace: str,
        name: str,
        *,
        node: str,
        annotations: dict[str, str] | None = None,
        phase: str = "Running",
        uid: str | None = None,
        labels: dict[str, str] | None = None,
        pod_ip: str | None = None,
        created: str | None = None,
        deletion_timestamp: str | None = None,
        claims: Sequence[str] = (),
    ) -> Pod:
        """Create a pod (ADDED). ``node=""``: unscheduled; ``created``: its
        creationTimestamp (RFC 3339; a fixed default); ``deletion_timestamp``: terminating;
        ``claims``: the ResourceClaims its spec names."""
        return self.pods.add_pod(
            namespace,
            name,
            node=node,
            annotations=annotations,
            phase=phase,
            uid=uid,
            labels=labels,
            pod_ip=pod_ip,
            created=created,
            deletion_timestamp=deletion_timestamp,
            claims=claims,
        )

    def update_pod(
        self,
        namespace: str,
        name: str,
        *,
        annotations: dict[str, str] | None = None,
        node: str | None = None,
        phase: str | None = None,
        labels: dict[str, str] | None = None,
        pod_ip: str | None = None,
        deletion_timestamp: str | None = None,
    ) -> Pod:
        """Change the given fields (MODIFIED): None leaves one alone, maps are replaced
        wholesale, ``""`` removes nodeName, podIP or deletionTimestamp."""
        return self.pods.update_pod(
            namespace,
            name,
            annotations=annotations,
            node=node,
            phase=phase,
            labels=labels,
            pod_ip=pod_ip,
            deletion_timestamp=deletion_timestamp,
        )

    def delete_pod(self, namespace: str, name: str) -> None:
        self.pods.delete_pod(namespace, name)

    def pod(self, namespace: str, name: str) -> Pod | None:
        return self.pods.get((namespace, name))

    # -- nodes ------------------------------------------------------------------

    def add_node(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        conditions: list[dict[str, Any]] | None = None,
        uid: str | None = None,
    ) -> Node:
        """Create a Node (ADDED); ``conditions`` default to a kubelet-like Ready (``[]``: none)."""
        return self.nodes.add_node(name, labels=labels, conditions=conditions, uid=uid)

    def update_node_labels(self, name: str, labels: Mapping[str, str]) -> Node:
        """Replace the Node's labels (MODIFIED; selecting watches see it come or go)."""
        return self.nodes.update_node_labels(name, labels)

    def delete_node(self, name: str) -> None:
        self.nodes.delete_node(name)

    def node(self, name: str) -> Node | None:
        """The Node's current JSON (no kind/apiVersion), or None."""
        return self.nodes.node(name)

    def node_status_writes(self, node: str | None = None) -> list[NodeStatusWrite]:
        """Every successful status PATCH (of ``node``, or all), in order."""
        return self.nodes.status_writes(node)

    # -- leases -----------------------------------------------------------------

    def lease(self, namespace: str, name: str) -> Obj | None:
        """The Lease's current JSON (no kind/apiVersion), or None."""
        return self.leases.lease(namespace, name)

    def add_lease(
        self,
        namespace: str,
        name: str,
        *,
        holder: str,
        lease_duration_s: int = 15,
        acquire_time: str | None = None,
        renew_time: str | None = None,
        transitions: int = 0,
        user_agent: str = "test",
    ) -> Obj:
        """Create a Lease as if ``user_agent`` had POSTed it (e.g. held by a gone replica)."""
        return self.leases.add_lease(
            namespace,
            name,
            holder=holder,
            lease_duration_s=lease_duration_s,
            acquire_time=acquire_time,
            renew_time=renew_time,
            transitions=transitions,
            user_agent=user_agent,
        )

    def lease_writes(
        self, namespace: str | None = None, name: str | None = None
    ) -> list[LeaseWrite]:
        """Every successful create/update of a Lease, in order."""
        return self.leases.writes(namespace, name)

    def lease_states(self) -> dict[Key, LeaseState]:
        """Every Lease's holder and last successful write, now."""
        return self.leases.states()

    # -- events -----------------------------------------------------------------

    def events(self) -> list[dict[str, Any]]:
        """The created Events, in order, as the server answered them."""
        return [write.event for write in self.events_store.writes()]

    def event_writes(self) -> list[EventWrite]:
        """The created Events with the server time and User-Agent of each."""
        return self.events_store.writes()

    # -- DRA: resource.k8s.io/v1 -----------------------------------------------

    def put_claim(self, claim: Obj) -> Obj:
        """Create or replace a ResourceClaim given whole (as the scheduler writes its
        allocation on a real cluster)."""
        return self._resource_store(self.claims).put_claim(claim)

    def delete_claim(self, namespace: str, name: str) -> None:
        self._resource_store(self.claims).delete((namespace, name))

    def put_slice(self, item: Obj) -> Obj:
        """Create or replace a ResourceSlice given whole (as a DRA driver publishes it)."""
        return self._resource_store(self.slices).put_slice(item)

    def delete_slice(self, name: str) -> None:
        self._resource_store(self.slices).delete(("", name))

    def put_taint_rule(self, rule: Obj) -> Obj:
        """Create a DeviceTaintRule given whole (as another writer would have)."""
        store = self._resource_store(self.taint_rules)
        stored = copy.deepcopy(rule)
        stored["metadata"].setdefault("uid", str(uuid.uuid4()))
        return store.create(("", stored["metadata"]["name"]), stored)

    def taint_rule_names(self) -> list[str]:
        keys = self._resource_store(self.taint_rules).keys()
        return [name for _, name in keys]

    def serve_resource_api(self, served: bool) -> None:
        """Start or stop serving resource.k8s.io/v1 (its objects are kept): every path of
        the group answers 404 while it is not served, and open watches are cut, as an
        API server restarted with the group switched off or on would."""
        if self.claims is None:
            raise ValueError("this fake has no resource.k8s.io/v1 (resource_api=False)")
        self.resource_served = served
        self.drop_watches()

    @staticmethod
    def _resource_store(store: _S | None) -> _S:
        if store is None:
            raise ValueError("this fake serves no resource.k8s.io/v1 (resource_api=False)")
        return store

    # -- the shared state -------------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self.versions.current

    def atomic(self) -> contextlib.AbstractContextManager[None]:
        """Hold the server's lock: no watcher sees any of the changes made inside
        until all of them are done (combine with drop_watches + compact to make a
        watcher miss events and come back to a 410)."""
        return self.versions.atomic()

    def compact(self) -> None:
        """Forget history of every kind up to now; a watch from an older rv gets 410
        and a pending ``continue`` expires."""
        with self.versions.cond:
            for store in (self.pods, self.nodes, self.leases, self.events_store):
                store.compact()
            for dra in (self.claims, self.slices):
                if dra is not None:
                    dra.compact()

    # -- stream controls (every open watch, pods and nodes alike) ---------------

    def bookmark(self) -> None:
        """Send a BOOKMARK at the current rv on every open watch that allows them."""
        self._bump("bookmark_gen")

    def drop_watches(self) -> None:
        """Abort every open watch connection mid-stream (no terminating chunk)."""
        self._bump("drop_gen")

    def end_watches(self) -> None:
        """End every open watch cleanly, as the server does at ``timeoutSeconds``."""
        self._bump("end_gen")

    def stall_watches(self, stalled: bool = True) -> None:
        """Open watches (and new ones) go silent: no events, no end, until unstalled."""
        with self.versions.cond:
            self.watch_controls.stalled = stalled
            self.versions.cond.notify_all()

    def _bump(self, name: str) -> None:
        with self.versions.cond:
            setattr(self.watch_controls, name, getattr(self.watch_controls, name) + 1)
            self.versions.cond.notify_all()

    # -- fault injection (kube_faults) ------------------------------------------

    def fail_next(
        self,
        kind: RequestKind,
        code: int,
        *,
        count: int = 1,
        retry_after: int | None = None,
        in_stream: bool = False,
        method: str | None = None,
    ) -> None:
        """The next ``count`` requests of ``kind`` (and ``method``, if given) answer ``code``
        with a Status body; ``in_stream`` (watches only): a 200 stream carrying one ERROR."""
        self.faults.fail_next(
            kind, code, count=count, retry_after=retry_after, in_stream=in_stream, method=method
        )

    def throttle(self, kind: RequestKind, per_second: int, *, retry_after: int = 1) -> None:
        """At most ``per_second`` requests of ``kind`` a second; the rest answer 429 with
        ``retry_after`` (0: no throttle)."""
        self.faults.throttle(kind, per_second, retry_after=retry_after)

    def hang_next(
        self, kind: RequestKind, seconds: float, *, count: int = 1, method: str | None = None
    ) -> None:
        """The next ``count`` requests of ``kind`` wait ``seconds``, then are served."""
        self.faults.hang_next(kind, seconds, count=count, method=method)

    def hang_next_lists(self, seconds: float, *, count: int = 1) -> None:
        """The next ``count`` pod lists wait ``seconds`` before answering."""
        self.faults.hang_next("list", seconds, count=count)

    def delay_bodies(self, seconds: float) -> None:
        """Send each answer's body ``seconds`` after its headers (a slow or segmented
        network): a client that hands its connection back before reading the body finds
        that body where the next answer should be. 0 undoes it."""
        self.body_delay = seconds

    def clear_faults(self) -> None:
        """Drop pending faults and hangs (cut-offs stay until restored)."""
        self.faults.clear()

    def cut_off(
        self,
        agent: str,
        *,
        status: int = 503,
        retry_after: int | None = None,
        hang_s: float | None = None,
    ) -> None:
        """Until restored, every request whose User-Agent contains ``agent`` answers
        ``status`` (its open watches are cut), or with ``hang_s`` hangs that long and is
        dropped unserved (its open watches go silent): a partition from that client."""
        self.faults.cut_off(agent, status=status, retry_after=retry_after, hang_s=hang_s)

    def restore(self, agent: str | None = None) -> None:
        """Undo cut_off(``agent``), or every cut-off; hung requests are dropped at once."""
        self.faults.restore(agent)

    # -- observation ------------------------------------------------------------

    def count(self, kind: RequestKind) -> int:
        return len(self.faults.requests(kind))

    def requests(self, kind: RequestKind | None = None) -> list[RequestRecord]:
        return self.faults.requests(kind)

    @property
    def open_watches(self) -> int:
        """Open watch streams of every kind."""
        with self.versions.cond:
            return sum(self.watch_controls.open_watches.values())

    def open_watch_count(self, kind: RequestKind) -> int:
        """Open watch streams of one request kind (``watch``, ``node_watch``, ``lease``)."""
        with self.versions.cond:
            return self.watch_controls.open_watches.get(kind, 0)
