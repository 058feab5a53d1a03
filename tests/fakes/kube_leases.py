"""Leases in the fake API server: ``/apis/coordination.k8s.io/v1/namespaces/{ns}/leases``.

Served, with the real server's optimistic concurrency and answers:

- ``GET .../leases`` (a ``LeaseList``; paging, selectors and ``watch=true``
  as for any collection) and ``GET .../leases/{name}`` (404 ``NotFound``).
- ``POST .../leases``: 201 with the created Lease; an existing name is 409
  ``AlreadyExists``; a ``metadata.resourceVersion`` in the body is refused
  500 ("resourceVersion should not be set on objects to be created"), as the
  real storage refuses it.
- ``PUT .../leases/{name}``: 200 with the stored Lease; a missing Lease is
  created (201: Leases allow create on update, whatever resourceVersion the
  body carries); a ``metadata.uid`` in the body is a precondition: 409
  ``Conflict`` unless the stored Lease has that uid (so a Lease read, then
  deleted, is not recreated by a PUT of what was read); a
  ``metadata.resourceVersion`` that is not the current one is 409
  ``Conflict``; none at all is 422 (Leases allow no unconditional update).
- Bodies are checked as the real server checks them: the name and namespace
  must agree with the URL (400), ``spec.leaseDurationSeconds`` must be > 0 and
  ``spec.leaseTransitions`` >= 0 (422 ``Invalid``), ``acquireTime`` and
  ``renewTime`` must be MicroTime (``2006-01-02T15:04:05.000000Z07:00``:
  exactly six fractional digits; anything else 400; stored in UTC), wrong
  JSON types 400.
- ``spec`` keeps holderIdentity, leaseDurationSeconds, acquireTime, renewTime
  and leaseTransitions as sent; ``null`` fields are left out and unknown spec
  fields dropped with a ``Warning: 299`` header naming each (the real
  server's default field validation); the coordinated leader election fields
  (``strategy``, ``preferredHolder``) are dropped silently, as a 1.37 server
  without that feature gate drops them. The metadata keeps labels,
  annotations, owner references and finalizers as sent. Every write bumps
  the resourceVersion, except one that changes nothing.

Not modelled: DELETE and PATCH (405), generateName, dry runs.

For tests: the Lease as stored, a log of successful writes (server time,
User-Agent, holder), and each Lease's state for fencing checks: its holder and
the server time of the last successful create/update (the write that put that
holder there or renewed it).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tests.fakes.kube_store import Key, Obj, ObjectStore, ResourceVersions
from tests.fakes.kube_wire import (
    already_exists,
    conflict,
    normalize_micro_time,
    not_found,
    now_rfc3339,
    status_body,
    typed,
)

GROUP = "coordination.k8s.io"
LEASE_FIELDS = {
    "metadata.name": lambda lease: lease["metadata"]["name"],
    "metadata.namespace": lambda lease: lease["metadata"]["namespace"],
}
# Known to the real server, dropped while the CoordinatedLeaderElection gate is off.
_GATED_SPEC_FIELDS = ("strategy", "preferredHolder")
_USER_METADATA = {"labels": dict, "annotations": dict, "ownerReferences": list, "finalizers": list}
_SPEC_FIELDS = {
    "holderIdentity": str,
    "leaseDurationSeconds": int,
    "acquireTime": str,
    "renewTime": str,
    "leaseTransitions": int,
}


class LeaseRequestError(Exception):
    """A request the server refuses; ``body`` is its Status."""

    def __init__(self, code: int, message: str, body: Obj | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.body = body or status_body(code, message)


@dataclass(frozen=True, kw_only=True)
class LeaseState:
    """A Lease as a fencing check sees it at one instant."""

    holder: str  # spec.holderIdentity ("" when released or unset)
    renewed_at: float  # server time.monotonic() of the last successful create/update
    renewed_by: str  # the User-Agent of that write
    resource_version: str
    lease_duration_s: int | None


@dataclass(frozen=True, kw_only=True)
class LeaseWrite:
    """One successful create (POST) or update (PUT) of a Lease."""

    at: float  # server time.monotonic()
    namespace: str
    name: str
    method: str
    user_agent: str
    holder: str
    resource_version: str  # after the write
    spec: dict[str, Any]


class LeaseStore(ObjectStore):
    """Leases keyed by (namespace, name), their write log and per-Lease state."""

    def __init__(self, *, versions: ResourceVersions, history_limit: int = 1000) -> None:
        super().__init__(
            kind="Lease",
            api_version=f"{GROUP}/v1",
            versions=versions,
            history_limit=history_limit,
        )
        self._states: dict[Key, LeaseState] = {}
        self._writes: list[LeaseWrite] = []

    def lease(self, namespace: str, name: str) -> Obj | None:
        return self.get((namespace, name))

    def states(self) -> dict[Key, LeaseState]:
        with self.cond:
            return dict(self._states)

    def writes(self, namespace: str | None = None, name: str | None = None) -> list[LeaseWrite]:
        with self.cond:
            return [
                w
                for w in self._writes
                if namespace in (None, w.namespace) and name in (None, w.name)
            ]

    def create_lease(self, namespace: str, body: Any, *, user_agent: str) -> Obj:
        """POST: raises LeaseRequestError."""
        metadata, spec = _checked(namespace, body)
        name = metadata.get("name")
        if not isinstance(name, str) or not name:
            raise LeaseRequestError(422, "metadata.name: Required value: name is required")
        if metadata.get("resourceVersion"):
            raise LeaseRequestError(
                500, "resourceVersion should not be set on objects to be created"
            )
        lease: Obj = {
            "metadata": {
                **_user_metadata(metadata),
                "name": name,
                "namespace": namespace,
                "uid": str(uuid.uuid4()),
                "creationTimestamp": now_rfc3339(),
            },
            "spec": spec,
        }
        with self.cond:
            try:
                created = self.create((namespace, name), lease)
            except ValueError as err:
                raise LeaseRequestError(
                    409, str(err), already_exists("leases", GROUP, name)
                ) from err
            self._log("POST", created, user_agent)
            return created

    def update_lease(
        self, namespace: str, name: str, body: Any, *, user_agent: str
    ) -> tuple[Obj, bool]:
        """PUT: (the Lease, whether it was created); raises LeaseRequestError."""
        metadata, spec = _checked(namespace, body)
        if metadata.get("name") != name:
            raise LeaseRequestError(
                400,
                f"the name of the object ({metadata.get('name')}) does not match the name on"
                f" the URL ({name})",
            )
        with self.cond:
            current = self.get((namespace, name))
            uid = metadata.get("uid")
            if uid and (current is None or current["metadata"]["uid"] != uid):
                stored_uid = "" if current is None else current["metadata"]["uid"]
                body_409 = conflict("leases", GROUP, name)
                body_409["message"] = (
                    f'Operation cannot be fulfilled on leases.{GROUP} "{name}": Precondition'
                    f" failed: UID in precondition: {uid}, UID in object meta: {stored_uid}"
                )
                raise LeaseRequestError(409, "conflict", body_409)
            if current is None:
                fresh = {**body, "metadata": {**metadata, "resourceVersion": ""}}
                return self.create_lease(namespace, fresh, user_agent=user_agent), True
            wanted = metadata.get("resourceVersion")
            if not wanted:
                raise LeaseRequestError(
                    422,
                    f'leases.coordination.k8s.io "{name}" is invalid: metadata.resourceVersion:'
                    " Invalid value: 0: must be specified for an update",
                )
            if str(wanted) != current["metadata"]["resourceVersion"]:
                raise LeaseRequestError(409, "conflict", conflict("leases", GROUP, name))
            kept = {
                k: current["metadata"][k] for k in ("name", "namespace", "uid", "creationTimestamp")
            }
            lease = {"metadata": {**_user_metadata(metadata), **kept}, "spec": spec}
            stored = self.replace((namespace, name), lease, skip_unchanged=True)
            self._log("PUT", stored, user_agent)
            return stored, False

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
        """Create a Lease directly (logged as a POST by ``user_agent``), e.g. one held by a
        replica that is gone. Times default to now, as MicroTime."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = {
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": lease_duration_s,
                "acquireTime": acquire_time or now,
                "renewTime": renew_time or now,
                "leaseTransitions": transitions,
            },
        }
        return self.create_lease(namespace, body, user_agent=user_agent)

    def _log(self, method: str, lease: Obj, user_agent: str) -> None:
        at = time.monotonic()
        metadata, spec = lease["metadata"], lease["spec"]
        key = (metadata["namespace"], metadata["name"])
        holder = str(spec.get("holderIdentity") or "")
        rv = metadata["resourceVersion"]
        self._states[key] = LeaseState(
            holder=holder,
            renewed_at=at,
            renewed_by=user_agent,
            resource_version=rv,
            lease_duration_s=spec.get("leaseDurationSeconds"),
        )
        self._writes.append(
            LeaseWrite(
                at=at,
                namespace=key[0],
                name=key[1],
                method=method,
                user_agent=user_agent,
                holder=holder,
                resource_version=rv,
                spec=dict(spec),
            )
        )


def _checked(namespace: str, body: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metadata, spec as stored) of a Lease body, or LeaseRequestError."""
    if not isinstance(body, dict):
        raise LeaseRequestError(400, "the request body is not a JSON object")
    metadata = body.get("metadata") or {}
    raw_spec = body.get("spec") or {}
    if not isinstance(metadata, dict) or not isinstance(raw_spec, dict):
        raise LeaseRequestError(400, "metadata and spec must be JSON objects")
    if metadata.get("namespace") not in (None, "", namespace):
        raise LeaseRequestError(
            400,
            "the namespace of the provided object does not match the namespace sent on the request",
        )
    spec: dict[str, Any] = {}
    for name, value in raw_spec.items():
        wanted = _SPEC_FIELDS.get(name)
        if wanted is None or value is None:
            continue  # unknown fields are dropped, nulls left out
        if not isinstance(value, wanted) or isinstance(value, bool):
            raise LeaseRequestError(
                400, f"json: cannot unmarshal {type(value).__name__} into spec.{name}"
            )
        stored = value
        if wanted is str and name.endswith("Time"):
            try:
                stored = normalize_micro_time(value)
            except ValueError as err:
                raise LeaseRequestError(
                    400, f'Lease in version "v1" cannot be handled as a Lease: {err}'
                ) from None
        spec[name] = stored
    duration = spec.get("leaseDurationSeconds")
    if duration is not None and duration <= 0:
        raise LeaseRequestError(
            422, f"spec.leaseDurationSeconds: Invalid value: {duration}: must be greater than 0"
        )
    transitions = spec.get("leaseTransitions")
    if transitions is not None and transitions < 0:
        raise LeaseRequestError(
            422,
            f"spec.leaseTransitions: Invalid value: {transitions}: must be greater than or"
            " equal to 0",
        )
    return metadata, spec


def unknown_fields(body: Any) -> list[str]:
    """The spec fields the real server would warn about and drop."""
    raw_spec = body.get("spec") if isinstance(body, dict) else None
    if not isinstance(raw_spec, dict):
        return []
    known = (*_SPEC_FIELDS, *_GATED_SPEC_FIELDS)
    return [f"spec.{name}" for name in raw_spec if name not in known]


def _user_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """The metadata a client may set on a Lease."""
    kept = _USER_METADATA.items()
    return {k: metadata[k] for k, kind in kept if isinstance(metadata.get(k), kind)}


class LeasesEndpoint:
    """Mixed into the handler, which supplies ``fake``, ``headers``, ``_send_json`` and
    ``_collection``."""

    def _serve_leases(
        self, method: str, namespace: str, name: str | None, query: dict[str, str], raw: bytes
    ) -> None:
        handler: Any = self
        store: LeaseStore = handler.fake.leases
        user_agent = handler.headers.get("User-Agent", "")
        if method == "GET" and name is None:
            handler._collection(store, LEASE_FIELDS, query, kind="lease", namespace=namespace)
            return
        if method == "GET":
            assert name is not None
            lease = store.lease(namespace, name)
            if lease is None:
                handler._send_json(404, not_found("leases", GROUP, name))
            else:
                handler._send_json(200, typed(lease, store.kind, store.api_version))
            return
        try:
            body = json.loads(raw)
        except ValueError as err:
            handler._send_json(400, status_body(400, f"the request body is not JSON: {err}"))
            return
        try:
            if method == "POST":
                lease, created = store.create_lease(namespace, body, user_agent=user_agent), True
            else:
                assert name is not None
                lease, created = store.update_lease(namespace, name, body, user_agent=user_agent)
        except LeaseRequestError as err:
            handler._send_json(err.code, err.body)
            return
        unknown = unknown_fields(body)
        headers = {"Warning": ", ".join(f'299 - "unknown field \\"{f}\\""' for f in unknown)}
        handler._send_json(
            201 if created else 200,
            typed(lease, store.kind, store.api_version),
            headers if unknown else None,
        )
