"""YAML read strictly, remembering where in the file each value came from.

PyYAML keeps the last of two equal keys without a word, and forgets positions
once it has built Python values. A configuration file's reader needs both: a
duplicate key is an error, and every error names ``file:line:column``.
Positions are keyed by the path a validator names a value with: ``gpus``,
``gpus[0]``, ``gpus[0].uuid``, ``pods[1].annotations["capwatch.io/x"]``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

# The last step of a path: ".key", "[3]" or '["key"]'.
_LAST_STEP = re.compile(r'(\.[^.\[]+|\[\d+\]|\["[^"]*"\])$')


@dataclass(frozen=True, kw_only=True)
class Position:
    line: int  # 1-based, as editors count
    column: int  # 1-based

    def __str__(self) -> str:
        return f"{self.line}:{self.column}"


def join(path: str, key: str) -> str:
    """The path of ``key`` in the mapping at ``path``."""
    return f"{path}.{key}" if path else key


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys (PyYAML keeps the last silently),
    and anchors and aliases: a few lines of nested aliases (a "billion laughs") expand
    to more values than any validator can walk, and no configuration needs them."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event: yaml.Event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            mark = event.start_mark  # the pure-Python loader's
            raise yaml.composer.ComposerError(
                None,
                None,
                "anchors and aliases (&name, *name) are not supported: write each value out",
                mark if isinstance(mark, yaml.error.Mark) else None,
            )
        return super().compose_node(parent, index)


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: set[object] = set()
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            continue
        if key_node.value in seen:  # reported where the second one is
            raise yaml.constructor.ConstructorError(
                None, None, f"found duplicate key {key_node.value!r}", key_node.start_mark
            )
        seen.add(key_node.value)
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load(text: str) -> tuple[object, dict[str, Position]]:
    """The document and where each of its values starts. Raises yaml.YAMLError."""
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        data = None if node is None else loader.construct_document(node)
    finally:
        loader.dispose()
    positions: dict[str, Position] = {}
    if node is not None:
        _walk(node, "", positions)
    return data, positions


def position_of(path: str, positions: Mapping[str, Position]) -> Position | None:
    """Where ``path`` is, or the nearest enclosing value that is (a missing key: its mapping)."""
    while True:
        if path in positions:
            return positions[path]
        shorter = _LAST_STEP.sub("", path)
        if shorter == path:
            return positions.get("")
        path = shorter


def describe(exc: yaml.YAMLError, source: str) -> str:
    """``source:line:column: what`` for a PyYAML error, on one line."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
    parts = [getattr(exc, "context", None), getattr(exc, "problem", None)]
    what = ", ".join(" ".join(str(p).split()) for p in parts if p) or " ".join(str(exc).split())
    return f"{where}: {what}"


def _walk(node: yaml.Node, path: str, out: dict[str, Position]) -> None:
    # A tree: without aliases no node is reached twice.
    out.setdefault(path, _position(node.start_mark))
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode):
                continue
            # An error about an entry points at its key: the line a reader looks for.
            out.setdefault(join(path, str(key.value)), _position(key.start_mark))
            out.setdefault(f'{path}["{key.value}"]', _position(key.start_mark))
            _walk(value, join(path, str(key.value)), out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, f"{path}[{index}]", out)


def _position(mark: yaml.Mark) -> Position:
    return Position(line=mark.line + 1, column=mark.column + 1)
