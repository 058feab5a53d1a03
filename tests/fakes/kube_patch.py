"""Patch semantics the fake Kubernetes API server applies: strategic merge and JSON merge.

- **Strategic merge** (``application/strategic-merge-patch+json``): maps merge
  recursively and a ``null`` deletes a key, as in a JSON merge patch; a list
  with a declared ``patchMergeKey`` (here ``status.conditions`` of a Node,
  keyed by ``type``) merges element by element: a patch element replaces the
  fields it gives of the element with the same key, or is appended; an element
  ``{"type": X, "$patch": "delete"}`` removes that element. Lists without a
  merge key are replaced wholesale. An element without the merge key is an
  error the real server answers 500 (``does not contain declared merge key``).
  Not modelled, and answered 400 saying so: the other directives
  (``$patch: replace``, ``$retainKeys``, ``$setElementOrder/...``,
  ``$deleteFromPrimitiveList/...``) and merge keys other than the conditions'.
- **JSON merge** (``application/merge-patch+json``, RFC 7386): maps merge,
  ``null`` deletes, every list is replaced wholesale.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

Path = tuple[str, ...]


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
    for key, value in patch.items():
        if key.startswith("$"):
            raise PatchError(
                400, f"strategic merge directive {key!r} at {_dotted(path)} is not modelled"
            )
        where = (*path, key)
        if value is None:
            result.pop(key, None)
        elif where in merge_keys:
            if not isinstance(value, list):
                raise PatchError(400, f"{_dotted(where)}: expected a list, got {value!r}")
            result[key] = _merge_list(result.get(key), value, merge_keys[where], where)
        elif isinstance(value, dict):
            result[key] = strategic_merge(result.get(key), value, merge_keys, where)
        else:
            result[key] = copy.deepcopy(value)
    return result


def _merge_list(target: Any, patch: list[Any], key: str, where: Path) -> list[Any]:
    result: list[Any] = copy.deepcopy(target) if isinstance(target, list) else []
    for item in patch:
        if not isinstance(item, dict):
            raise PatchError(400, f"{_dotted(where)}: expected a map element, got {item!r}")
        if key not in item:
            raise PatchError(500, f"map: {item} does not contain declared merge key: {key}")
        directive = item.get("$patch")
        same = [i for i, e in enumerate(result) if isinstance(e, dict) and e.get(key) == item[key]]
        if directive == "delete":
            result = [e for i, e in enumerate(result) if i not in same]
            continue
        if directive is not None:
            raise PatchError(
                400, f"{_dotted(where)}: $patch {directive!r} in a list element is not modelled"
            )
        if same:
            result[same[0]] = strategic_merge(result[same[0]], item, {}, where)
        else:
            result.append(strategic_merge({}, item, {}, where))
    return result


def _dotted(path: Path) -> str:
    return ".".join(path) or "the top level"
