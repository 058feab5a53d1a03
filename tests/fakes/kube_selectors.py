r"""Field and label selectors, as the fake Kubernetes API server applies them.

- ``fieldSelector``: a conjunction of ``field=value``, ``field==value`` and
  ``field!=value`` over the fields each resource supports (the table is the
  resource's; an unsupported field answers 400, as the real server does).
  As in k8s.io/apimachinery/pkg/fields: terms split on unescaped commas
  (empty terms are skipped), nothing is trimmed, ``\\``, ``\,`` and ``\=``
  escape, and an unescaped ``=`` or ``,`` in a value is 400.
- ``labelSelector``: k8s.io/apimachinery/pkg/labels' grammar, comma-joined:
  ``k=v``, ``k==v``, ``k!=v`` (true also when the label is absent), ``k``
  (the label exists), ``!k`` (it does not), ``k in (a,b)``, ``k notin (a)``
  (true also when absent) and ``k>n``/``k<n`` (integers); whitespace between
  tokens is ignored. Keys and values are validated as the real server
  validates them (``[prefix/]name``, at most 63 characters a name or value,
  alphanumerics with ``-_.`` inside).

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
        for term in _split_unescaped(text, ","):
            if not term:
                continue
            name, sep, raw = _split_field_term(term)
            if name not in getters:
                raise SelectorError(f"field label not supported: {name}")
            terms.append((name, _unescape(raw), sep == "!="))
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

    requirements: tuple[tuple[str, str, tuple[str, ...]], ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> LabelSelector:
        if not text or not text.strip():
            return cls()
        return cls(requirements=_LabelParser(text).parse())

    def matches(self, obj: Obj | None) -> bool:
        if obj is None:
            return False
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(_holds(labels, key, op, values) for key, op, values in self.requirements)


def _holds(labels: Mapping[str, str], key: str, op: str, values: tuple[str, ...]) -> bool:
    present = key in labels
    if op == "exists":
        return present
    if op == "!exists":
        return not present
    if op == "in":
        return present and labels[key] in values
    if op == "notin":
        return not present or labels[key] not in values
    if not present:
        return False
    try:
        number = int(labels[key])
    except ValueError:
        return False
    return number > int(values[0]) if op == "gt" else number < int(values[0])


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


_SPECIAL = "=!(),<>"
_OPERATORS = {"=": "in", "==": "in", "!=": "notin", ">": "gt", "<": "lt"}


class _LabelParser:
    """labels.Parse: a lexer of identifiers, keywords and symbols, and its grammar."""

    def __init__(self, text: str) -> None:
        self.tokens = self._lex(text)
        self.at = 0

    @staticmethod
    def _lex(text: str) -> list[str]:
        tokens, i = [], 0
        while i < len(text):
            ch = text[i]
            if ch.isspace():
                i += 1
            elif ch in _SPECIAL:
                two = text[i : i + 2]
                width = 2 if two in ("==", "!=") else 1
                tokens.append(text[i : i + width])
                i += width
            else:
                j = i
                while j < len(text) and not text[j].isspace() and text[j] not in _SPECIAL:
                    j += 1
                tokens.append(text[i:j])
                i = j
        return tokens

    def _peek(self) -> str:
        return self.tokens[self.at] if self.at < len(self.tokens) else ""

    def _take(self) -> str:
        symbol = self._peek()
        self.at += 1
        return symbol

    def parse(self) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
        out = [self._requirement()]
        while self.at < len(self.tokens):
            symbol = self._take()
            if symbol != ",":
                raise SelectorError(f"found '{symbol}', expected: ',' or 'end of string'")
            if self.at >= len(self.tokens):
                raise SelectorError("found '', expected: identifier after ','")
            out.append(self._requirement())
        return tuple(out)

    def _identifier(self) -> str:
        symbol = self._take()
        if not symbol or symbol in _SPECIAL or symbol in ("==", "!="):
            raise SelectorError(f"found '{symbol}', expected: identifier")
        return symbol

    def _requirement(self) -> tuple[str, str, tuple[str, ...]]:
        if self._peek() == "!":
            self._take()
            key = self._identifier()
            _check_key(key)
            return key, "!exists", ()
        key = self._identifier()
        _check_key(key)
        following = self._peek()
        if following in ("", ","):
            return key, "exists", ()
        self._take()
        if following in ("in", "notin"):
            return key, following, self._set(key)
        if following not in _OPERATORS:
            raise SelectorError(
                f"unable to parse requirement: found '{following}', expected: in, notin, =,"
                " ==, !=, gt, lt"
            )
        value = self._peek() if self._peek() not in ("", ",") else ""
        if value:
            self._take()
        if following in (">", "<"):
            if not re.fullmatch(r"-?\d+", value):
                raise SelectorError(
                    f"unable to parse requirement: values[0]: Invalid value: {value!r}: for"
                    " 'Gt', 'Lt' operators, the value must be an integer"
                )
        else:
            _check_value(key, value)
        return key, _OPERATORS[following], (value,)

    def _set(self, key: str) -> tuple[str, ...]:
        symbol = self._take()
        if symbol != "(":
            raise SelectorError(f"unable to parse requirement: found '{symbol}' expected: '('")
        values: list[str] = []
        expect_value = True
        while True:
            symbol = self._take()
            if symbol == ")":
                if values and expect_value:
                    values.append("")
                return tuple(values)
            if symbol == ",":
                if expect_value:
                    values.append("")
                expect_value = True
            elif symbol and symbol not in _SPECIAL and expect_value:
                _check_value(key, symbol)
                values.append(symbol)
                expect_value = False
            else:
                raise SelectorError(f"unable to parse requirement: found '{symbol}', expected: ')'")


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts, current, escaped = [], "", False
    for ch in text:
        if escaped:
            current += ch
            escaped = False
        elif ch == "\\":
            current += ch
            escaped = True
        elif ch == sep:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return parts


def _split_field_term(term: str) -> tuple[str, str, str]:
    i = 0
    while i < len(term):
        if term[i] == "\\":
            i += 2
            continue
        for sep in ("!=", "==", "="):
            if term.startswith(sep, i):
                return term[:i], sep, term[i + len(sep) :]
        i += 1
    raise SelectorError(f"invalid selector: '{term}'; can't understand '{term}'")


def _unescape(value: str) -> str:
    out, i = "", 0
    while i < len(value):
        ch = value[i]
        if ch == "\\":
            if i + 1 >= len(value) or value[i + 1] not in "\\,=":
                raise SelectorError(f"invalid field selector: invalid escape sequence in {value!r}")
            out += value[i + 1]
            i += 2
            continue
        if ch in ",=":
            raise SelectorError(f"invalid field selector: unescaped character in value: {ord(ch)}")
        out += ch
        i += 1
    return out


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
