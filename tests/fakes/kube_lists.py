"""The fake API server's collection reads: LIST of any kind, and the hand-off to WATCH.

A mixin for the fake's request handler. ``GET <collection>`` answers a
``<Kind>List`` (items without kind/apiVersion, as the real server sends them)
with ``metadata.resourceVersion``, ``limit``/``continue`` paging (a consistent
snapshot; ``remainingItemCount`` while more remain) and ``fieldSelector`` and
``labelSelector`` (kube_selectors; a bad one answers 400 with a ``Status``).
``resourceVersion`` on a list ("", "0" or any exact version) is served from the
current state, which is what a NotOlderThan read may return; the
resourceVersionMatch parameter and its semantics are not modelled.
With ``watch=true`` the same selectors go to kube_watch.
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
        try:
            parts: list[Selector] = [
                FieldSelector.parse(query.get("fieldSelector"), fields),
                LabelSelector.parse(query.get("labelSelector")),
            ]
            if namespace is not None:
                parts.append(InNamespace(namespace))
            selector = AllOf(tuple(parts))
            if query.get("watch", "").lower() in ("true", "1"):
                handler._watch(store, selector, query, kind)
            else:
                self._list(store, selector, query)
        except SelectorError as err:
            handler._send_json(400, status_body(400, str(err)))
        except ExpiredError as err:
            handler._send_json(410, status_body(410, str(err)))

    def _list(self, store: ObjectStore, selector: Selector, query: dict[str, str]) -> None:
        handler: Any = self
        try:
            limit = int(query.get("limit") or 0)
        except ValueError as err:
            raise SelectorError(f"invalid limit: {query['limit']!r}") from err
        page = store.list_page(selector, limit=limit, token=query.get("continue", ""))
        metadata: dict[str, Any] = {"resourceVersion": str(page.resource_version)}
        if page.continue_token:
            metadata["continue"] = page.continue_token
            metadata["remainingItemCount"] = page.remaining
        body = {
            "kind": store.list_kind,
            "apiVersion": store.api_version,
            "metadata": metadata,
            "items": page.items,
        }
        handler._send_json(200, body)
