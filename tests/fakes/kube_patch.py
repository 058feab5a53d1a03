"""Patch semantics the fake Kubernetes API server applies: strategic merge, JSON merge
and JSON patch, as the real API server (k8s.io/apimachinery strategicpatch) applies them.

- **Strategic merge** (``application/strategic-merge-patch+json``): maps merge
  recursively and a ``null`` deletes a key, as in a JSON merge patch; a list
  with a declared ``patchMergeKey`` (a Node's ``status.conditions`` and
  ``status.addresses``, keyed by ``type``) merges element by element: a patch
  element replaces the fields it gives of the element with the same key, or is
  added. The result is ordered as the real server orders it: the patch's
  elements in the patch's order, the others (the server-only ones) in their
  own order, interleaved where their places in the live list say so, so that
  an element new to the list comes *first*, not last. Directives:
  ``{"type": X, "$patch": "delete"}`` removes that element;
  ``{"$patch": "replace"}`` in a list replaces it with the patch's other
  elements; ``$setElementOrder/<list>`` orders the list. Errors, with the real
  server's codes: an element without the merge key, ``$patch: merge`` or an
  unknown ``$patch`` 500; an element that is not a map 500; a value that
  cannot be the field's type 422. Lists without a merge key are replaced
  wholesale. Not modelled, and answered 400 saying so: ``$retainKeys``,
  ``$deleteFromPrimitiveList/...``, a top-level ``$patch`` and merge keys
  other than those above.
- **JSON merge** (``application/merge-patch+json``, RFC 7386): maps merge,
  ``null`` deletes, every list is replaced wholesale.
- **JSON patch** (``application/json-patch+json``, RFC 6902): ``add``,
  ``remove``, ``replace``, ``move``, ``copy`` and ``test`` at JSON pointers; a
  patch that is not a list of operations is 400, one that does not apply (an
  unknown op, a missing path, a failed test) 422, as the real server answers.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

Path = tuple[str, ...]
_ORDER = "$setElementOrder/"


class PatchError(ValueError):
    """A patch that cannot be applied; ``code`` is the HTTP status the real server answers."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def json_merge(target: Any, patch: Any) -> Any:
    """RFC 7386: ``patch`` applied to ``target`` (neither is changed)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = json_merge(result.get(key), value)
    return result


def strategic_merge(
    target: Any, patch: Mapping[str, Any], merge_keys: Mapping[Path, str], path: Path = ()
) -> dict[str, Any]:
    """``patch`` (a map) merged into ``target``; ``merge_keys`` maps list paths to their key."""
    result: dict[str, Any] = copy.deepcopy(target) if isinstance(target, dict) else {}
    orders = _element_orders(patch, merge_keys, path)
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        where = (*path, key)
        if value is None:
            result.pop(key, None)
        elif where in merge_keys:
            if not isinstance(value, list):
                raise PatchError(422, f"{_dotted(where)}: cannot restore slice from {value!r}")
            merged = _merge_list(result.get(key), value, merge_keys[where], orders.get(key))
            result[key] = merged
        elif isinstance(value, dict):
            result[key] = strategic_merge(result.get(key), value, merge_keys, where)
        else:
            result[key] = copy.deepcopy(value)
    for key, order in orders.items():
        if key not in patch and isinstance(result.get(key), list):
            result[key] = _merge_list(result[key], [], merge_keys[(*path, key)], order)
    return result


def _element_orders(
    patch: Mapping[str, Any], merge_keys: Mapping[Path, str], path: Path
) -> dict[str, list[Any]]:
    """The ``$setElementOrder/<list>`` directives of one map; 400 for other directives."""
    orders: dict[str, list[Any]] = {}
    for key, value in patch.items():
        if key.startswith(_ORDER) and (*path, key[len(_ORDER) :]) in merge_keys:
            if not isinstance(value, list):
                raise PatchError(400, f"{key}: expected a list, got {value!r}")
            orders[key[len(_ORDER) :]] = value
        elif key.startswith("$"):
            raise PatchError(
                400, f"strategic merge directive {key!r} at {_dotted(path)} is not modelled"
            )
    return orders


def _merge_list(target: Any, patch: list[Any], key: str, order: list[Any] | None) -> list[Any]:
    """One merging list: deletions and replace first, then the merge, then the order."""
    original, plain = _special_elements(target, patch, key)
    merged = list(original)
    for item in plain:
        at = next((i for i, e in enumerate(merged) if _same(e, item, key)), None)
        if at is None:
            merged.append(strategic_merge({}, item, {}))
        else:
            merged[at] = strategic_merge(merged[at], item, {})
    wanted = order if order is not None else plain
    for item in wanted:
        if not isinstance(item, dict):
            raise PatchError(500, f"list element types are not identical: {item!r}")
        _need_key(item, key)
    ordered = [e for e in merged if _index(wanted, e, key) >= 0]
    ordered.sort(key=lambda e: _index(wanted, e, key))
    server_only = [e for e in merged if _index(wanted, e, key) < 0]
    return _interleave(server_only, ordered, original, key)


def _special_elements(
    target: Any, patch: list[Any], key: str
) -> tuple[list[Any], list[dict[str, Any]]]:
    """(the live list after ``$patch`` deletions or a replace, the plain patch elements)."""
    original: list[Any] = copy.deepcopy(target) if isinstance(target, list) else []
    plain: list[dict[str, Any]] = []
    replace = False
    for item in patch:
        if not isinstance(item, dict):
            raise PatchError(500, f"list element types are not identical: {item!r}")
        directive = item.get("$patch")
        if directive is None:
            _need_key(item, key)
            plain.append(item)
        elif directive == "delete":
            _need_key(item, key)
            original = [e for e in original if not _same(e, item, key)]
        elif directive == "replace":
            replace = True
        elif directive == "merge":
            raise PatchError(500, "merging lists cannot yet be specified in the patch")
        else:
            raise PatchError(500, f"unknown patch type: {directive} in map: {item}")
    if replace:
        return [copy.deepcopy(item) for item in plain], []
    return original, plain


def _interleave(left: list[Any], right: list[Any], live: list[Any], key: str) -> list[Any]:
    """strategicpatch's mergeSortedSlice: each server-only element (``left``) goes before
    the first patch element (``right``) that comes after it in the live list; a patch
    element absent from the live list goes before the server-only ones."""
    out: list[Any] = []
    i = j = 0
    while i < len(left) or j < len(right):
        if j >= len(right):
            out.append(left[i])
            i += 1
        elif i >= len(left):
            out.append(right[j])
            j += 1
        else:
            li, ri = _index(live, left[i], key), _index(live, right[j], key)
            if li >= 0 and ri >= 0 and li < ri:
                out.append(left[i])
                i += 1
            else:
                out.append(right[j])
                j += 1
    return out


def _need_key(item: dict[str, Any], key: str) -> None:
    if key not in item:
        raise PatchError(500, f"map: {item} does not contain declared merge key: {key}")


def _same(element: Any, item: Mapping[str, Any], key: str) -> bool:
    return isinstance(element, dict) and key in element and element[key] == item[key]


def _index(items: list[Any], element: Any, key: str) -> int:
    return next((i for i, e in enumerate(items) if _same(e, element, key)), -1)


def _dotted(path: Path) -> str:
    return ".".join(path) or "the top level"


# -- RFC 6902 ------------------------------------------------------------------------


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902: ``operations`` applied to a copy of ``target``."""
    if not isinstance(operations, list):
        raise PatchError(400, "a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or not isinstance(op.get("op"), str):
            raise PatchError(400, f"invalid JSON patch operation: {op!r}")
        name, path = op["op"], _pointer(op, "path")
        if name in ("add", "replace", "test") and "value" not in op:
            raise PatchError(400, f"JSON patch operation {name!r} needs a value")
        if name == "add":
            doc = _put(doc, path, copy.deepcopy(op["value"]), insert=True)
        elif name == "replace":
            _get(doc, path)
            doc = _put(doc, path, copy.deepcopy(op["value"]), insert=False)
        elif name == "remove":
            doc = _remove(doc, path)
        elif name in ("move", "copy"):
            source = _pointer(op, "from")
            value = copy.deepcopy(_get(doc, source))
            if name == "move":
                doc = _remove(doc, source)
            doc = _put(doc, path, value, insert=True)
        elif name == "test":
            if _get(doc, path) != op["value"]:
                raise PatchError(422, f"testing value {path!r} failed")
        else:
            raise PatchError(422, f"unexpected JSON patch kind {name!r}")
    return doc


def _pointer(op: Mapping[str, Any], field: str) -> list[str]:
    raw = op.get(field)
    if not isinstance(raw, str) or (raw and not raw.startswith("/")):
        raise PatchError(400, f"JSON patch {field!r} is not a JSON pointer: {raw!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in raw.split("/")[1:]]


def _missing(path: list[str]) -> PatchError:
    # The real server wraps a patch that does not apply in a 422.
    return PatchError(422, f"the server rejected our request: no path /{'/'.join(path)}")


def _step(node: Any, part: str, path: list[str]) -> Any:
    if isinstance(node, dict) and part in node:
        return node[part]
    if isinstance(node, list) and part.isdigit() and int(part) < len(node):
        return node[int(part)]
    raise _missing(path)


def _get(doc: Any, path: list[str]) -> Any:
    node = doc
    for part in path:
        node = _step(node, part, path)
    return node


def _put(doc: Any, path: list[str], value: Any, *, insert: bool) -> Any:
    if not path:
        return value
    parent = _get(doc, path[:-1])
    last = path[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-" and insert:
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent) - (0 if insert else 1):
            if insert:
                parent.insert(int(last), value)
            else:
                parent[int(last)] = value
        else:
            raise _missing(path)
    else:
        raise _missing(path)
    return doc


def _remove(doc: Any, path: list[str]) -> Any:
    if not path:
        raise _missing(path)
    parent = _get(doc, path[:-1])
    _step(parent, path[-1], path)
    if isinstance(parent, dict):
        del parent[path[-1]]
    else:
        del parent[int(path[-1])]
    return doc
