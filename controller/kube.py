"""The controller's Kubernetes API calls, through
:class:`~capwatch.kube.transport.ApiTransport`.

Requests are JSON bodies built here, and raw JSON answers decoded here: typed
models cost more than the few fields the controller reads, and an apply of one
condition is clearer as the JSON it is. The User-Agent names this replica, so an API
server's audit log (and the fake server's write log in the tests) can tell who
wrote what; every write carries the release's one field manager
(``RELEASE-controller``), so the objects' ``managedFields`` tell whose they are.

Deadlines. Calls block, so they run on a bounded thread pool of their own, and
a call handed to the pool is sent whenever one of its threads gets to it:
after the other calls queued before it, or, if the process was paused (a long
GC, a starved node, SIGSTOP), after the pause. So every call carries an
absolute deadline on this process's monotonic clock (the API's ``clock``,
which must be the fence's): a condition write or an Event the instant its
fence closes (``deadline``, read from the fence on the event loop), any other
call ``deadline_s`` seconds after it was made. The sending thread checks it
before it hands the request to urllib3, and again at each write of the
request's bytes to its connection (the headers, then the body: the transport's
connections are of a class that checks before every ``send``), so a pause
anywhere in urllib3, even between the headers and the body, stops
the request rather than sending it late: a call whose deadline has passed is
not sent, or not finished (:class:`~capwatch.controller.errors.DeadlinePassed`; the API
server never applies a request whose body did not arrive), and one that is
sent gets what is left (urllib3's total timeout: connect and read together),
so no request leaves after, or is waited for beyond, what its caller allowed.
What remains is a pause between the last check and the ``sendall`` it guards,
a few bytecodes, and what happens to a request after it left
(docs/controller.md, "Fencing the API server enforces").

Failures become :class:`~capwatch.controller.errors.ApiError` (with the HTTP status and
Retry-After), :class:`~capwatch.controller.errors.Conflict` (409),
:class:`~capwatch.controller.errors.NotFound` (404) or
:class:`~capwatch.controller.errors.DeadlinePassed` (not sent).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import secrets
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import urllib3
import urllib3.connection
import urllib3.exceptions

from capwatch.controller.conditions import CONDITION_TYPE, NodeCondition
from capwatch.controller.errors import (
    FENCING_MARK,
    ApiError,
    Conflict,
    DeadlinePassed,
    FencedOut,
    FieldConflict,
    NotFound,
)
from capwatch.controller.leasing import LeaseRecord
from capwatch.controller.objects import (
    FieldOwner,
    condition_apply,
    condition_owners,
    lease_body,
    lease_record,
    resource_version,
    rfc3339,
)
from capwatch.controller.writes.recorder import NodeEvent
from capwatch.kit.clock import Clock, SystemClock
from capwatch.kube.client import api_transport
from capwatch.kube.transport import ApiTransport
from capwatch.kube.wire import APPLY, TRANSIENT, retry_after_seconds, status_message

log = logging.getLogger(__name__)

EVENT_NAMESPACE = "default"  # where Node events live (the kubelet's choice too)
TAINT_RULES = "/apis/resource.k8s.io/v1/devicetaintrules"
NODES = "/api/v1/nodes"
PAGE_SIZE = 500  # objects per page of a list
COMPONENT = "capwatch-controller"
SMP = "application/strategic-merge-patch+json"
_WRITES = frozenset({"POST", "PUT", "PATCH"})
# "Apply failed with 2 conflicts: conflicts with \"kubectl-edit\" with subresource ..."
_CONFLICTING = re.compile(r'conflicts? with "([^"]+)"')


# KubeApi's threads, each with at most one request in flight.
KUBE_THREADS = 16
# The discovery's list+watch of agent pods and of GPU nodes, open for good.
DISCOVERY_WATCHES = 2


def api_client(kubeconfig: str | None, *, identity: str) -> ApiTransport:
    """The transport to the cluster (in-cluster, else the kubeconfig), naming this replica,
    with a connection kept for each of KubeApi's threads and each discovery watch: with
    fewer, a busy moment would drop connections and pay for new TLS handshakes."""
    return api_transport(
        kubeconfig,
        user_agent=f"{COMPONENT}/{identity}",
        connections=KUBE_THREADS + DISCOVERY_WATCHES,
    )


# The request the thread is sending, for its connection's every ``send``: the clock,
# the deadline on it, and what the request is.
_sending = threading.local()


def _check_sending() -> None:
    """Raise DeadlinePassed if this thread's request is past its deadline."""
    request: tuple[Clock, float, str] | None = getattr(_sending, "request", None)
    if request is None:
        return  # not one of KubeApi's (the discovery's reads share the client)
    clock, deadline, what = request
    left = deadline - clock.monotonic()
    if left <= 0:
        raise DeadlinePassed(f"{what}: not sent, its deadline passed {-left:.3f}s ago")


class _HTTPConnection(urllib3.connection.HTTPConnection):
    def send(self, data: Any) -> None:
        _check_sending()
        super().send(data)


class _HTTPSConnection(urllib3.connection.HTTPSConnection):
    def send(self, data: Any) -> None:
        _check_sending()
        super().send(data)


class _HTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


class KubeApi:
    """Node status, Events and Leases, asynchronously (blocking calls on a thread pool).

    Every call takes ``deadline`` (an instant on ``clock``: the fence's) or
    ``deadline_s`` (seconds from now); see the module docstring."""

    def __init__(
        self,
        client: ApiTransport,
        *,
        namespace: str,
        identity: str,
        release: str = "capwatch",
        max_threads: int = KUBE_THREADS,
        clock: Clock | None = None,
    ) -> None:
        self._client = client
        self._namespace = namespace
        self._identity = identity
        # The release's own component: two releases' Events on one Node tell apart, and
        # the one field manager of everything it writes (managedFields say whose it is).
        self._component = f"{release}-controller"
        self._manager = {"fieldManager": self._component}
        self._clock: Clock = clock or SystemClock()
        self._pool = ThreadPoolExecutor(max_threads, thread_name_prefix="capwatch-kube")
        # Connections from now on check the sending thread's deadline at every send.
        client.use_pool_classes(http=_HTTPPool, https=_HTTPSPool)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- conditions ----------------------------------------------------------------------

    async def apply_condition(
        self,
        node: str,
        condition: NodeCondition,
        *,
        deadline: float | None = None,
        deadline_s: float | None = None,
        force: bool = False,
    ) -> int | None:
        """Server-side apply of the condition; the Node's resourceVersion after it."""
        answer = await self._call(
            "PATCH",
            f"/api/v1/nodes/{node}/status",
            query={"force": "true"} if force else None,
            body=condition_apply(node, condition),
            content_type=APPLY,
            deadline=_deadline(self._clock, deadline, deadline_s),
        )
        return resource_version(answer)

    async def condition_owners(
        self, node: str, *, deadline: float | None = None, deadline_s: float | None = None
    ) -> tuple[FieldOwner, ...]:
        answer = await self._call(
            "GET", f"{NODES}/{node}", deadline=_deadline(self._clock, deadline, deadline_s)
        )
        return condition_owners(answer, manager=self._component)

    async def remove_condition(
        self, node: str, *, deadline: float | None = None, deadline_s: float | None = None
    ) -> None:
        """Delete ``GPUPowerCapEnforced`` from the Node's conditions (by merge key)."""
        body = {"status": {"conditions": [{"type": CONDITION_TYPE, "$patch": "delete"}]}}
        await self._call(
            "PATCH",
            f"/api/v1/nodes/{node}/status",
            body=body,
            content_type=SMP,
            deadline=_deadline(self._clock, deadline, deadline_s),
        )

    async def list_nodes(self, *, label_selector: str, deadline_s: float) -> list[dict[str, Any]]:
        """Every node matching ``label_selector``, as raw JSON objects (paged)."""
        return await self._list_all(NODES, label_selector, deadline_s)

    async def list_page(
        self, path: str, *, label_selector: str, token: str, deadline_s: float
    ) -> tuple[list[dict[str, Any]], str]:
        """One page (:data:`PAGE_SIZE` objects) of the list endpoint ``path``, from
        ``token`` ("": the first page): its objects and the next page's token ("": none)."""
        return await self._page(
            path, label_selector, token, _deadline(self._clock, None, deadline_s)
        )

    async def _page(
        self, path: str, label_selector: str, token: str, deadline: float
    ) -> tuple[list[dict[str, Any]], str]:
        query = {"labelSelector": label_selector, "limit": str(PAGE_SIZE)}
        if token:
            query["continue"] = token
        page = await self._call("GET", path, query=query, deadline=deadline)
        items = [i for i in page.get("items") or [] if isinstance(i, dict)]
        return items, str((page.get("metadata") or {}).get("continue") or "")

    async def _list_all(
        self, path: str, label_selector: str, deadline_s: float
    ) -> list[dict[str, Any]]:
        """Every object of a list endpoint, page by page under one deadline."""
        items: list[dict[str, Any]] = []
        token = ""
        at = _deadline(self._clock, None, deadline_s)
        while True:
            page, token = await self._page(path, label_selector, token, at)
            items += page
            if not token:
                return items

    # --- events --------------------------------------------------------------------------

    async def create_event(
        self, event: NodeEvent, *, deadline: float | None = None, deadline_s: float | None = None
    ) -> None:
        at = _deadline(self._clock, deadline, deadline_s)
        stamp = rfc3339(event.wall)
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                # As the kubelet names them (the object, then the time in ns), plus a
                # random tail: two transitions in one clock tick must not collide.
                "name": f"{event.node}.{int(event.wall * 1e9):x}{secrets.token_hex(2)}",
                "namespace": EVENT_NAMESPACE,
            },
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Node",
                "name": event.node,
                "uid": event.node,
            },
            "reason": event.reason,
            "message": event.message,
            "type": event.type.value,
            "source": {"component": self._component},
            "reportingComponent": f"capwatch.io/{self._component}",
            "reportingInstance": self._identity,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        await self._call(
            "POST", f"/api/v1/namespaces/{EVENT_NAMESPACE}/events", body=body, deadline=at
        )

    # --- device taint rules --------------------------------------------------------------

    async def list_taint_rules(
        self, *, label_selector: str, deadline_s: float
    ) -> list[dict[str, Any]]:
        """Every DeviceTaintRule matching ``label_selector`` (paged)."""
        return await self._list_all(TAINT_RULES, label_selector, deadline_s)

    async def apply_taint_rule(
        self,
        name: str,
        body: dict[str, Any],
        *,
        deadline: float | None = None,
        deadline_s: float | None = None,
    ) -> dict[str, Any]:
        """Server-side apply of the rule (created if absent), never forced."""
        return await self._call(
            "PATCH",
            f"{TAINT_RULES}/{name}",
            body=body,
            content_type=APPLY,
            deadline=_deadline(self._clock, deadline, deadline_s),
        )

    async def delete_taint_rule(
        self, name: str, *, deadline: float | None = None, deadline_s: float | None = None
    ) -> None:
        await self._call(
            "DELETE", f"{TAINT_RULES}/{name}", deadline=_deadline(self._clock, deadline, deadline_s)
        )

    # --- leases --------------------------------------------------------------------------

    def _lease_path(self, name: str = "") -> str:
        base = f"/apis/coordination.k8s.io/v1/namespaces/{self._namespace}/leases"
        return f"{base}/{name}" if name else base

    async def get_lease(self, name: str, *, deadline_s: float) -> LeaseRecord | None:
        try:
            return lease_record(
                await self._call(
                    "GET",
                    self._lease_path(name),
                    deadline=_deadline(self._clock, None, deadline_s),
                )
            )
        except NotFound:
            return None

    async def create_lease(
        self, name: str, record: LeaseRecord, *, deadline_s: float
    ) -> LeaseRecord:
        body = lease_body(name, self._namespace, record)
        return lease_record(
            await self._call(
                "POST",
                self._lease_path(),
                body=body,
                deadline=_deadline(self._clock, None, deadline_s),
            )
        )

    async def update_lease(
        self, name: str, record: LeaseRecord, *, deadline_s: float
    ) -> LeaseRecord:
        body = lease_body(name, self._namespace, record)
        return lease_record(
            await self._call(
                "PUT",
                self._lease_path(name),
                body=body,
                deadline=_deadline(self._clock, None, deadline_s),
            )
        )

    # --- the one way out -----------------------------------------------------------------

    async def _call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: object = None,
        content_type: str = "application/json",
        deadline: float,
    ) -> dict[str, Any]:
        if method in _WRITES:
            query = {**self._manager, **(query or {})}  # the one field manager, every write
        call = functools.partial(
            self._request,
            method,
            path,
            query=query,
            body=body,
            content_type=content_type,
            deadline=deadline,
        )
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def _request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None,
        body: object,
        content_type: str,
        deadline: float,
    ) -> dict[str, Any]:
        """On a pool thread: the request, unless its ``deadline`` has passed."""
        what = f"{method} {path}"
        try:
            payload = None if body is None else json.dumps(body).encode()
            # Not at all once the deadline has passed, and never for longer than is
            # left of it (a total timeout, so connect and read together). Checked
            # again at every send.
            left = deadline - self._clock.monotonic()
            if left <= 0:
                raise DeadlinePassed(f"{what}: not sent, its deadline passed {-left:.3f}s ago")
            _sending.request = (self._clock, deadline, what)
            try:
                response = self._client.request(
                    method,
                    path,
                    query=query,
                    body=payload,
                    content_type=content_type,
                    timeout=left,
                )
            finally:
                _sending.request = None
            try:
                data = response.data
            finally:
                response.release_conn()
        except TRANSIENT as err:
            raise ApiError(f"{what}: {type(err).__name__}: {err}") from err
        status = response.status
        if 200 <= status < 300:
            try:
                decoded = json.loads(data) if data else {}
            except ValueError as err:
                raise ApiError(f"{method} {path}: the answer is not JSON", status=status) from err
            return decoded if isinstance(decoded, dict) else {}
        message = f"{method} {path}: HTTP {status} {status_message(data)}"
        if status == 404:
            raise NotFound(message, status=status)
        if status == 409:
            managers = tuple(dict.fromkeys(_CONFLICTING.findall(message)))
            if managers:
                raise FieldConflict(message, managers=managers)
            raise Conflict(message, status=status)
        if status == 403 and FENCING_MARK in message:
            raise FencedOut(message, status=status)
        raise ApiError(message, status=status, retry_after=retry_after_seconds(response.headers))


def _deadline(clock: Clock, deadline: float | None, deadline_s: float | None) -> float:
    """The call's deadline on ``clock``: ``deadline`` as given, or ``deadline_s`` from now."""
    if (deadline is None) == (deadline_s is None):
        raise TypeError("give a deadline or deadline_s, one of the two")
    return deadline if deadline is not None else clock.monotonic() + (deadline_s or 0.0)
