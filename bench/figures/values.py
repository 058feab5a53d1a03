"""A results file's figures as the charts read them: each accessor returns the figure at
a path of keys, or raises :class:`BadFigures` naming the figure that is missing or of the
wrong type (the one line bench/figures/plot.py prints)."""

from __future__ import annotations

from typing import Any


class BadFigures(Exception):
    """A results file that cannot be drawn: its message is the one line printed."""


def get(figures: Any, *keys: str | int) -> Any:
    found: Any = figures
    for i, key in enumerate(keys):
        ok = (isinstance(found, dict) and key in found) or (
            isinstance(found, list) and isinstance(key, int) and key < len(found)
        )
        if not ok:
            raise BadFigures(f"no {_path(keys[: i + 1])}")
        found = found[key]
    return found


def _path(keys: tuple[str | int, ...]) -> str:
    return "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in keys).lstrip(".")


def number(figures: Any, *keys: str | int) -> float:
    value = get(figures, *keys)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise BadFigures(f"{_path(keys)} is not a number")
    return float(value)


def numbers(figures: Any, *keys: str | int) -> list[float]:
    value = get(figures, *keys)
    if not isinstance(value, list) or not value:
        raise BadFigures(f"{_path(keys)} is not a list of numbers")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
        raise BadFigures(f"{_path(keys)} is not a list of numbers")
    return [float(v) for v in value]


def listed(figures: Any, *keys: str | int) -> list[Any]:
    value = get(figures, *keys)
    if not isinstance(value, list) or not value:
        raise BadFigures(f"{_path(keys)} is not a non-empty list")
    return value
