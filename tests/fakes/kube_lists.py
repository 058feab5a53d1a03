"""The fake API server's collection reads: LIST of any kind, and the hand-off to WATCH.

A mixin for the fake's request handler. ``GET <collection>`` answers a
``<Kind>List`` (items without kind/apiVersion, as the real server sends them)
with ``metadata.resourceVersion``, ``limit``/``continue`` paging (a consistent
snapshot; ``remainingItemCount`` while more remain, only for a list without
selectors, as the real server counts them) and ``fieldSelector`` and
``labelSelector`` (kube_selectors; a bad one answers 400 with a ``Status``).

``resourceVersion`` and ``resourceVersionMatch`` as the real server (with
its watch cache) reads them:

- none: the current state, a consistent read;
- ``0`` ("any"): the current state too, in one page whatever the ``limit``
  (the real watch cache ignores it);
- ``N`` with ``resourceVersionMatch=Exact``, or with a ``limit`` and no match
  (the legacy meaning): the state at exactly ``N``, paged at ``N``; 410 once
  that history is compacted;
- ``N`` with ``NotOlderThan``, or alone: the current state;
- an ``N`` beyond the current version waits up to 3 s for it, then answers
  504 ``Timeout`` ("Too large resource version").

Refused as the real server refuses them: a match without a version, an
unknown match, ``Exact`` at ``0`` or a match with ``continue`` (422
``Invalid`` on ListOptions), a version with ``continue`` or one that is not
an unsigned integer (400), a ``limit`` that is not an integer (400; a
negative one means none). With ``watch=true`` the same selectors go to
kube_watch (a resourceVersionMatch there is 422).
"""

from __future__ import annotations

from typing import Any

from tests.fakes.kube_selectors import (
    AllOf,
    FieldGetters,
    FieldSelector,
    InNamespace,
    LabelSelector,
    Selector,
    SelectorError,
)
from tests.fakes.kube_store import ExpiredError, ObjectStore
from tests.fakes.kube_wire import status_body

TOO_LARGE_WAIT_S = 3.0  # the real cacher's wait for a resourceVersion it has not seen
_MATCHES = ("Exact", "NotOlderThan", "")


class InvalidOptions(Exception):
    """ListOptions the real server rejects as 422 Invalid; ``causes`` are field errors."""

    def __init__(self, causes: list[str]) -> None:
        super().__init__("; ".join(causes))
        self.causes = causes

    def body(self) -> dict[str, Any]:
        shown = self.causes[0] if len(self.causes) == 1 else f"[{', '.join(self.causes)}]"
        return status_body(
            422,
            f'ListOptions.meta.k8s.io "" is invalid: {shown}',
            details={"group": "meta.k8s.io", "kind": "ListOptions"},
        )


class TooLarge(Exception):
    """A resourceVersion the server has not reached (504)."""

    def body(self) -> dict[str, Any]:
        return status_body(
            504,
            f"Timeout: {self}",
            details={
                "causes": [
                    {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
                ],
                "retryAfterSeconds": 1,
            },
        )


def list_options_errors(query: dict[str, str], *, watching: bool) -> list[str]:
    """ValidateListOptions' field errors for this query."""
    match = query.get("resourceVersionMatch", "")
    if not match:
        return []
    if watching:
        return [
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch"
            " unless sendInitialEvents is provided"
        ]
    errors = []
    if not query.get("resourceVersion"):
        errors.append(
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless"
            " resourceVersion is provided"
        )
    if query.get("continue"):
        errors.append(
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue"
            " is provided"
        )
    if match not in _MATCHES:
        errors.append(
            f'resourceVersionMatch: Unsupported value: "{match}": supported values: "Exact",'
            ' "NotOlderThan", ""'
        )
    if match == "Exact" and query.get("resourceVersion") == "0":
        errors.append(
            'resourceVersionMatch: Forbidden: resourceVersionMatch "exact" is forbidden for'
            ' resourceVersion "0"'
        )
    return errors


class ListEndpoint:
    """Mixed into the handler, which supplies ``_send_json`` and ``_watch``."""

    def _collection(
        self,
        store: ObjectStore,
        fields: FieldGetters,
        query: dict[str, str],
        *,
        kind: str,
        namespace: str | None = None,
    ) -> None:
        """LIST or WATCH (``kind`` is the request kind) of ``store``, optionally one namespace."""
        handler: Any = self
        watching = query.get("watch", "").lower() in ("true", "1")
        try:
            errors = list_options_errors(query, watching=watching)
            if errors:
                raise InvalidOptions(errors)
            parts: list[Selector] = [
                FieldSelector.parse(query.get("fieldSelector"), fields),
                LabelSelector.parse(query.get("labelSelector")),
            ]
            if namespace is not None:
                parts.append(InNamespace(namespace))
            selector = AllOf(tuple(parts))
            if watching:
                handler._watch(store, selector, query, kind)
            else:
                counted = not query.get("fieldSelector") and not query.get("labelSelector")
                self._list(store, selector, query, counted=counted)
        except SelectorError as err:
            handler._send_json(400, status_body(400, str(err)))
        except InvalidOptions as err:
            handler._send_json(422, err.body())
        except TooLarge as err:
            handler._send_json(504, err.body(), {"Retry-After": "1"})
        except ExpiredError as err:
            handler._send_json(410, status_body(410, str(err)))

    def _list(
        self, store: ObjectStore, selector: Selector, query: dict[str, str], *, counted: bool
    ) -> None:
        handler: Any = self
        raw_limit = query.get("limit") or "0"
        try:
            limit = max(0, int(raw_limit))
        except ValueError as err:
            raise SelectorError(f'strconv.ParseInt: parsing "{raw_limit}": invalid syntax') from err
        token = query.get("continue", "")
        raw_rv = query.get("resourceVersion", "")
        if token and raw_rv:
            raise SelectorError("specifying resource version is not allowed when using continue")
        at_rv = None
        if raw_rv == "0":
            limit = 0  # served from the watch cache, which does not page
        elif raw_rv:
            if not raw_rv.isdigit():
                raise SelectorError(
                    f'invalid resource version: resourceVersion: Invalid value: "{raw_rv}":'
                    " strconv.ParseUint: invalid syntax"
                )
            wanted = int(raw_rv)
            self._wait_for(store, wanted)
            match = query.get("resourceVersionMatch", "")
            if match == "Exact" or (not match and limit > 0):
                at_rv = wanted
        page = store.list_page(selector, limit=limit, token=token, at_rv=at_rv)
        metadata: dict[str, Any] = {"resourceVersion": str(page.resource_version)}
        if page.continue_token:
            metadata["continue"] = page.continue_token
            if counted:
                metadata["remainingItemCount"] = page.remaining
        body = {
            "kind": store.list_kind,
            "apiVersion": store.api_version,
            "metadata": metadata,
            "items": page.items,
        }
        handler._send_json(200, body)

    @staticmethod
    def _wait_for(store: ObjectStore, wanted: int) -> None:
        with store.cond:
            if not store.cond.wait_for(
                lambda: store.resource_version >= wanted, timeout=TOO_LARGE_WAIT_S
            ):
                raise TooLarge(
                    f"Too large resource version: {wanted}, current: {store.resource_version}"
                )
