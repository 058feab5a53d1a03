"""The fake API server's HTTP side: routing, request bodies, admission, JSON answers.

One handler class serves every endpoint; the endpoints themselves are mixins
(kube_lists, kube_watch, kube_nodes, kube_leases, kube_events). Routes:

====== =========================================================== ===============
GET    /api/v1/pods, /api/v1/namespaces/{ns}/pods                  list / watch
POST   /api/v1/namespaces/{ns}/events                              event
GET    /api/v1/events, /api/v1/namespaces/{ns}/events              event_list / event_watch
GET    /api/v1/nodes                                               node_list / node_watch
GET    /api/v1/nodes/{name}, /api/v1/nodes/{name}/status           node_get
PATCH  /api/v1/nodes/{name}/status                                 node_status
GET    /apis/coordination.k8s.io/v1/namespaces/{ns}/leases         lease
POST   the same                                                    lease
GET    .../leases/{name}, PUT .../leases/{name}                    lease
====== =========================================================== ===============

Any other path answers 404 and any other method on a routed path 405, each
with a ``Status`` body; neither is logged. A routed request is logged and
admitted by kube_faults (cut-off, injected fault, hang) before it is served.
"""

from __future__ import annotations

import contextlib
import json
import socketserver
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from tests.fakes.kube_events import EVENT_FIELDS, EventsEndpoint
from tests.fakes.kube_faults import WATCH_KINDS, CutOff, RequestKind, RequestRecord
from tests.fakes.kube_leases import GROUP, LeasesEndpoint
from tests.fakes.kube_lists import ListEndpoint
from tests.fakes.kube_nodes import APPLY, NODE_FIELDS, NodesEndpoint
from tests.fakes.kube_pods import POD_FIELDS
from tests.fakes.kube_resources import (
    CLAIM_FIELDS,
    SLICE_FIELDS,
    TAINT_RULE_FIELDS,
    ClaimStore,
    TaintRuleStore,
    resource_list,
)
from tests.fakes.kube_watch import WatchEndpoint
from tests.fakes.kube_wire import not_found, status_body, typed

if TYPE_CHECKING:
    from tests.fakes.kube_apiserver import FakeKubeApiServer

Route = tuple[RequestKind, Callable[[], None]]
_WRITES = ("POST", "PUT", "PATCH")


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host name (getfqdn), which can take
        # seconds in a sandbox; the fake only ever serves 127.0.0.1.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "127.0.0.1", self.server_address[1]


class Handler(
    EventsEndpoint,
    LeasesEndpoint,
    NodesEndpoint,
    ListEndpoint,
    WatchEndpoint,
    BaseHTTPRequestHandler,
):
    fake: FakeKubeApiServer  # set on the per-server subclass
    protocol_version = "HTTP/1.1"
    server_version = "fake-kube-apiserver/1"
    timeout = 10  # idle keep-alive connections do not pin a thread forever
    # Headers and body go out in separate writes; without TCP_NODELAY, Nagle plus
    # delayed ACKs add ~40 ms to every response.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        # Quiet: the test output is for the tests.
        pass

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")  # routed nowhere: 405 (or 404) with a Status body

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        parts = url.path.strip("/").split("/")
        # Read the whole body first: the connection stays usable whatever is answered.
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        routes = self._routes(parts, query, raw)
        if routes is None:
            self._send_json(404, status_body(404, f"the server could not find {url.path}"))
            return
        route = routes.get(method)
        if route is None:
            message = f"{method} {url.path} is not modelled by the fake API server"
            self._send_json(405, status_body(405, message))
            return
        kind, serve = route
        if self._admit(kind, method, url.path, query):
            serve()

    def _routes(
        self, parts: list[str], query: dict[str, str], raw: bytes
    ) -> dict[str, Route] | None:
        """The methods served at this path, or None for an unknown path."""
        fake = self.fake
        watching = query.get("watch", "").lower() in ("true", "1")
        match parts:
            case ["api", "v1", "pods"] | ["api", "v1", "namespaces", _, "pods"]:
                namespace = parts[3] if len(parts) == 5 else None
                kind: RequestKind = "watch" if watching else "list"
                return {
                    "GET": (
                        kind,
                        lambda: self._collection(
                            fake.pods, POD_FIELDS, query, kind=kind, namespace=namespace
                        ),
                    )
                }
            case ["api", "v1", "events"] | ["api", "v1", "namespaces", _, "events"]:
                namespace = parts[3] if len(parts) == 5 else None
                kind = "event_watch" if watching else "event_list"
                routes: dict[str, Route] = {
                    "GET": (
                        kind,
                        lambda: self._collection(
                            fake.events_store, EVENT_FIELDS, query, kind=kind, namespace=namespace
                        ),
                    )
                }
                if namespace is not None:
                    routes["POST"] = ("event", lambda: self._post_event(parts[3], raw))
                return routes
            case ["api", "v1", "nodes"]:
                kind = "node_watch" if watching else "node_list"
                return {
                    "GET": (
                        kind,
                        lambda: self._collection(fake.nodes, NODE_FIELDS, query, kind=kind),
                    )
                }
            case ["api", "v1", "nodes", name]:
                return {"GET": ("node_get", lambda: self._get_node(name))}
            case ["api", "v1", "nodes", name, "status"]:
                return {
                    "GET": ("node_get", lambda: self._get_node(name)),
                    "PATCH": ("node_status", lambda: self._patch_node_status(name, raw, query)),
                }
            case ["apis", "resource.k8s.io", *_]:
                return self._resource_routes(parts, query, raw)
            case ["apis", group, "v1", "namespaces", namespace, "leases", *rest] if (
                group == GROUP and len(rest) <= 1
            ):
                name = rest[0] if rest else None
                methods = ("GET", "PUT") if rest else ("GET", "POST")
                return {
                    m: ("lease", self._lease_call(m, namespace, name, query, raw)) for m in methods
                }
        return None

    def _resource_routes(
        self, parts: list[str], query: dict[str, str], raw: bytes
    ) -> dict[str, Route] | None:
        """resource.k8s.io/v1: discovery, claims, slices, DeviceTaintRules."""
        fake = self.fake
        watching = query.get("watch", "").lower() in ("true", "1")
        kind: RequestKind
        match parts:
            case ["apis", "resource.k8s.io", "v1"]:
                return {"GET": ("discovery", self._resource_discovery)}
            case ["apis", "resource.k8s.io", *_] if not fake.resource_served:
                return None
            case [
                "apis",
                "resource.k8s.io",
                "v1",
                "namespaces",
                namespace,
                "resourceclaims",
                name,
            ] if fake.claims is not None:
                claims = fake.claims
                return {"GET": ("claim_get", lambda: self._get_claim(claims, namespace, name))}
            case ["apis", "resource.k8s.io", "v1", "resourceclaims"] | [
                "apis",
                "resource.k8s.io",
                "v1",
                "namespaces",
                _,
                "resourceclaims",
            ] if fake.claims is not None:
                namespace = parts[4] if len(parts) == 6 else None
                claims = fake.claims
                kind = "claim_watch" if watching else "claim_list"
                return {
                    "GET": (
                        kind,
                        lambda: self._collection(
                            claims, CLAIM_FIELDS, query, kind=kind, namespace=namespace
                        ),
                    )
                }
            case ["apis", "resource.k8s.io", "v1", "devicetaintrules"] if fake.taint_rules:
                rules = fake.taint_rules
                return {
                    "GET": (
                        "taint_rule_list",
                        lambda: self._collection(
                            rules, TAINT_RULE_FIELDS, query, kind="taint_rule_list"
                        ),
                    ),
                    "POST": ("taint_rule", lambda: self._create_rule(rules, raw)),
                }
            case ["apis", "resource.k8s.io", "v1", "devicetaintrules", name] if fake.taint_rules:
                rules = fake.taint_rules
                return {
                    "PATCH": ("taint_rule", lambda: self._apply_rule(rules, name, query, raw)),
                    "DELETE": ("taint_rule", lambda: self._delete_rule(rules, name)),
                }
            case ["apis", "resource.k8s.io", "v1", "resourceslices"] if fake.slices is not None:
                slices = fake.slices
                kind = "slice_watch" if watching else "slice_list"
                return {
                    "GET": (kind, lambda: self._collection(slices, SLICE_FIELDS, query, kind=kind))
                }
        return None

    def _get_claim(self, claims: ClaimStore, namespace: str, name: str) -> None:
        claim = claims.get((namespace, name))
        if claim is None:
            self._send_json(404, not_found("resourceclaims", "resource.k8s.io", name))
        else:
            self._send_json(200, typed(claim, claims.kind, claims.api_version))

    def _create_rule(self, rules: TaintRuleStore, raw: bytes) -> None:
        body = json.loads(raw)
        name = body["metadata"]["name"]
        try:
            stored = rules.create(("", name), body)
        except ValueError:
            self._send_json(409, status_body(409, f'devicetaintrules "{name}" already exists'))
            return
        self._send_json(201, typed(stored, rules.kind, rules.api_version))

    def _apply_rule(
        self, rules: TaintRuleStore, name: str, query: dict[str, str], raw: bytes
    ) -> None:
        """Server-side apply as for a rule's only field manager: created if absent, else
        its labels, annotations and spec replaced by the applied ones. Field ownership
        is not modelled (no conflicts: a test of those uses the real server)."""
        if self.headers.get("Content-Type") != APPLY:
            self._send_json(415, status_body(415, "only server-side apply patches rules here"))
            return
        if not query.get("fieldManager"):
            message = "PATCH, application/apply-patch+yaml requests require fieldManager"
            self._send_json(400, status_body(400, message))
            return
        body = json.loads(raw)
        if body.get("metadata", {}).get("name") != name:
            self._send_json(400, status_body(400, f"the apply body does not name {name!r}"))
            return
        current = rules.get(("", name))
        if current is None:
            stored = rules.create(("", name), body)
            self._send_json(201, typed(stored, rules.kind, rules.api_version))
            return
        merged = {**current, "spec": body.get("spec", {})}
        merged["metadata"] = {
            **current["metadata"],
            **{k: body["metadata"][k] for k in ("labels", "annotations") if k in body["metadata"]},
        }
        # As the real server: an apply that changes nothing writes nothing.
        stored = rules.replace(("", name), merged, skip_unchanged=True)
        self._send_json(200, typed(stored, rules.kind, rules.api_version))

    def _delete_rule(self, rules: TaintRuleStore, name: str) -> None:
        try:
            gone = rules.delete(("", name))
        except KeyError:
            self._send_json(404, not_found("devicetaintrules", "resource.k8s.io", name))
            return
        self._send_json(200, typed(gone, rules.kind, rules.api_version))

    def _resource_discovery(self) -> None:
        if self.fake.claims is None or not self.fake.resource_served:
            message = "the server could not find the requested resource"
            self._send_json(404, status_body(404, message))
        else:
            self._send_json(200, resource_list())

    def _lease_call(
        self, method: str, namespace: str, name: str | None, query: dict[str, str], raw: bytes
    ) -> Callable[[], None]:
        return lambda: self._serve_leases(method, namespace, name, query, raw)

    # -- admission --------------------------------------------------------------

    def _admit(self, kind: RequestKind, method: str, path: str, query: dict[str, str]) -> bool:
        """Log the request and apply cut-offs, faults and hangs; True: serve it."""
        record = RequestRecord(
            kind=kind,
            path=path,
            query=query,
            at=time.monotonic(),
            peer=int(self.client_address[1]),
            method=method,
            user_agent=self.headers.get("User-Agent", ""),
        )
        admission = self.fake.faults.admit(record)
        if admission.cut is not None:
            self._cut_off(admission.cut)
            return False
        fault = admission.fault
        if fault is not None and fault.in_stream and kind in WATCH_KINDS:
            self._send_stream_error(status_body(fault.code, "injected fault"))
            return False
        if fault is not None:
            headers = {}
            if fault.retry_after is not None:
                headers["Retry-After"] = str(fault.retry_after)
            self._send_json(fault.code, status_body(fault.code, "injected fault"), headers)
            return False
        if admission.hang and self.fake._stop.wait(admission.hang):
            self._abort()
            return False
        return True

    def _cut_off(self, cut: CutOff) -> None:
        if cut.hang_s is None:
            headers = {} if cut.retry_after is None else {"Retry-After": str(cut.retry_after)}
            message = f"injected fault: client {cut.agent!r} is cut off"
            self._send_json(cut.status, status_body(cut.status, message), headers)
            return
        # A partition: nothing comes back, and the request is never served.
        deadline = time.monotonic() + cut.hang_s
        while time.monotonic() < deadline and self.fake.faults.is_active(cut):
            if self.fake._stop.wait(min(0.02, max(0.0, deadline - time.monotonic()))):
                break
        self._abort()

    # -- answers ----------------------------------------------------------------

    def _send_json(
        self, code: int, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.fake.body_delay:
            time.sleep(self.fake.body_delay)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(data)
