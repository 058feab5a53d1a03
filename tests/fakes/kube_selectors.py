"""Field and label selectors, as the fake Kubernetes API server applies them.

- ``fieldSelector``: a conjunction of ``field=value``, ``field==value`` and
  ``field!=value`` over the fields each resource supports (the table is the
  resource's; an unsupported field answers 400, as the real server does).
- ``labelSelector``: the equality-based grammar, comma-joined: ``k=v``,
  ``k==v``, ``k!=v`` (true also when the label is absent), ``k`` (the label
  exists) and ``!k`` (it does not). Keys and values are validated as the real
  server validates them (``[prefix/]name``, at most 63 characters a name or
  value, alphanumerics with ``-_.`` inside). Not modelled, and answered 400
  naming them: the set-based forms (``k in (a,b)``, ``k notin (...)``) and
  ``k>n``/``k<n``.

Lists and watches apply both; an object that stops matching shows on a watch
as DELETED, one that starts matching as ADDED (:mod:`tests.fakes.kube_store`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

Obj = dict[str, Any]
FieldGetters = Mapping[str, Callable[[Obj], str]]

_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class SelectorError(ValueError):
    """An unsupported or malformed selector or query parameter (the server answers 400)."""


class Selector(Protocol):
    def matches(self, obj: Obj | None) -> bool: ...


@dataclass(frozen=True, kw_only=True)
class FieldSelector:
    """A conjunction of ``field=value``, ``field==value`` and ``field!=value`` terms."""

    terms: tuple[tuple[str, str, bool], ...] = ()
    getters: FieldGetters = field(default_factory=dict, compare=False)

    @classmethod
    def parse(cls, text: str | None, getters: FieldGetters) -> FieldSelector:
        if not text:
            return cls(getters=getters)
        terms = []
        for raw in text.split(","):
            term = raw.strip()
            negate = "!=" in term
            sep = "!=" if negate else ("==" if "==" in term else "=")
            name, found, value = term.partition(sep)
            if not found or not name:
                raise SelectorError(f"invalid selector: {term!r}")
            if name not in getters:
                raise SelectorError(
                    f'field label not supported: "{name}" (supported: {", ".join(sorted(getters))})'
                )
            terms.append((name, value, negate))
        return cls(terms=tuple(terms), getters=getters)

    def matches(self, obj: Obj | None) -> bool:
        if obj is None:
            return False
        return all(
            (self.getters[name](obj) == value) != negate for name, value, negate in self.terms
        )


@dataclass(frozen=True, kw_only=True)
class LabelSelector:
    """Equality-based requirements on ``metadata.labels``, all of which must hold.

    Each requirement is (key, op, value) with op one of ``=``, ``!=``,
    ``exists``, ``!exists``.
    """

    requirements: tuple[tuple[str, str, str], ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> LabelSelector:
        if not text or not text.strip():
            return cls()
        return cls(requirements=tuple(_requirement(raw.strip()) for raw in text.split(",")))

    def matches(self, obj: Obj | None) -> bool:
        if obj is None:
            return False
        labels = obj.get("metadata", {}).get("labels") or {}
        for key, op, value in self.requirements:
            present = key in labels
            if op == "exists" and not present:
                return False
            if op == "!exists" and present:
                return False
            if op == "=" and (not present or labels[key] != value):
                return False
            if op == "!=" and present and labels[key] == value:
                return False
        return True


@dataclass(frozen=True)
class AllOf:
    """Every one of ``parts`` matches."""

    parts: tuple[Selector, ...]

    def matches(self, obj: Obj | None) -> bool:
        return obj is not None and all(part.matches(obj) for part in self.parts)


@dataclass(frozen=True)
class InNamespace:
    namespace: str

    def matches(self, obj: Obj | None) -> bool:
        return obj is not None and obj["metadata"].get("namespace") == self.namespace


def _requirement(term: str) -> tuple[str, str, str]:
    if not term:
        raise SelectorError("unable to parse requirement: found '', expected: identifier")
    padded = f" {term} "
    if any(token in padded for token in (" in ", " notin ", "(", ")", ">", "<")):
        raise SelectorError(
            f"unable to parse requirement {term!r}: set-based and numeric label selectors"
            " (in, notin, >, <) are not modelled by the fake API server"
        )
    if term.startswith("!"):
        key = term[1:].strip()
        _check_key(key)
        return key, "!exists", ""
    for sep, op in (("!=", "!="), ("==", "="), ("=", "=")):
        key, found, value = term.partition(sep)
        if found:
            key, value = key.strip(), value.strip()
            _check_key(key)
            _check_value(key, value)
            return key, op, value
    _check_key(term)
    return term, "exists", ""


def _check_key(key: str) -> None:
    prefix, slash, name = key.rpartition("/")
    ok = bool(name) and len(name) <= 63 and _NAME.fullmatch(name) is not None
    if slash:
        ok = ok and 0 < len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix) is not None
    if not ok:
        raise SelectorError(
            f"unable to parse requirement: invalid label key {key!r}: name part must consist"
            " of alphanumeric characters, '-', '_' or '.', and must start and end with an"
            " alphanumeric character (at most 63), with an optional DNS subdomain prefix and '/'"
        )


def _check_value(key: str, value: str) -> None:
    if value and (len(value) > 63 or _NAME.fullmatch(value) is None):
        raise SelectorError(
            f"unable to parse requirement: invalid label value {value!r} for key {key!r}: a"
            " valid label must be an empty string or consist of alphanumeric characters,"
            " '-', '_' or '.', and must start and end with an alphanumeric character"
        )
