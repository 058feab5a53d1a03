"""How the watch's text is laid out: lines of styled segments, tables, flowing parts.

Every line is a sequence of (text, style) segments: a terminal colours them
(failures red), plain output drops the styles. A table fits the width it is
given: the columns each width shows are chosen by rank, not by what the cells
hold, so the layout never jumps when a cycle fails (:func:`fit`); rich's
table lays the chosen columns out, cutting a cell too long with an ellipsis.
With no width (a pipe or a file) every column is shown, at its widest.
"""

from __future__ import annotations

import functools
import io
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table
from rich.text import Text

Style = str  # a style name ("bold red"); "" for none
Segment = tuple[str, Style]
Line = tuple[Segment, ...]

INDENT = "  "
GAP = "  "
FAILED, GOOD, QUIET, HEADER = "bold red", "green", "dim", "bold"


@dataclass(frozen=True, kw_only=True)
class Column:
    """A table column: shown ``min`` to ``max`` wide; ``rank`` 0 is always shown, the
    others only where they fit (lower ranks first); spare width goes to lower ``grow``
    first; ``floor`` is how far a column may shrink when even rank 0 does not fit."""

    name: str
    min: int
    max: int
    rank: int = 0
    grow: int = 9
    floor: int = 0


def plain(line: Line) -> str:
    return "".join(text for text, _ in line).rstrip()


def greyed(lines: Iterable[Line]) -> tuple[Line, ...]:
    """``lines`` with every segment dimmed: a picture that is no longer live."""
    return tuple(tuple((text, QUIET) for text, _ in line) for line in lines)


def cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, an ellipsis marking a cut."""
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def fit(columns: Sequence[Column], width: int | None) -> list[int | None]:
    """Each column's width at ``width`` characters (None: not shown; no width: all, widest)."""
    if width is None:
        return [c.max for c in columns]
    shown = {i for i, c in enumerate(columns) if c.rank == 0}

    def need(which: set[int]) -> int:
        return len(INDENT) + sum(columns[i].min for i in which) + len(GAP) * (len(which) - 1)

    for i in sorted((i for i, c in enumerate(columns) if c.rank), key=lambda i: columns[i].rank):
        if need(shown | {i}) <= width:
            shown.add(i)
    widths = {i: columns[i].min for i in shown}
    spare = width - need(shown)
    for i in sorted(shown, key=lambda i: columns[i].grow):
        step = min(spare, columns[i].max - widths[i]) if spare > 0 else 0
        if spare < 0 and columns[i].floor:
            step = -min(-spare, widths[i] - columns[i].floor)
        widths[i] += step
        spare -= step
    return [widths.get(i) for i in range(len(columns))]


def table(
    columns: Sequence[Column],
    rows: Iterable[tuple[Sequence[str], Sequence[Style]]],
    width: int | None,
) -> list[Line]:
    """A header line and one line per row: the columns and widths ``fit`` chooses, laid
    out by rich's table (cells cut with an ellipsis, never wrapped)."""
    widths = fit(columns, width)
    layout = tuple((c.name, size) for c, size in zip(columns, widths, strict=True))
    header = _header(layout)
    return [header, *(_row(layout, tuple(cells), tuple(styles)) for cells, styles in rows)]


# Column widths are fixed by ``fit``, so a row's line depends on that row alone: each is
# laid out once and kept (a cluster's board redraws thousands of unchanged rows).
_Layout = tuple[tuple[str, int | None], ...]


@functools.lru_cache(maxsize=64)
def _header(layout: _Layout) -> Line:
    return _render(layout, [tuple(Text(name, style=HEADER) for name, _ in layout)])


@functools.lru_cache(maxsize=1 << 14)
def _row(layout: _Layout, cells: tuple[str, ...], styles: tuple[Style, ...]) -> Line:
    return _render(layout, [tuple(Text(c, style=s) for c, s in zip(cells, styles, strict=True))])


def _render(layout: _Layout, rows: list[tuple[Text, ...]]) -> Line:
    grid = Table(box=None, padding=(0, 1), pad_edge=False, show_edge=False, show_header=False)
    shown = [i for i, (_, size) in enumerate(layout) if size is not None]
    for i in shown:
        grid.add_column(width=layout[i][1], no_wrap=True, overflow="ellipsis")
    for row in rows:
        grid.add_row(*(row[i] for i in shown))
    total = sum(layout[i][1] or 0 for i in shown) + len(GAP) * (len(shown) - 1)
    console = Console(width=total, file=io.StringIO(), color_system=None, highlight=False)
    (line,) = console.render_lines(grid, console.options.update_width(total))
    return ((INDENT, ""), *((s.text, str(s.style) if s.style else "") for s in line if s.text))


def flow(parts: Sequence[Line], width: int | None) -> list[Line]:
    """Parts joined by two spaces, on as many lines as ``width`` needs (indented after
    the first); a part wider than a whole line is cut."""
    lines: list[list[Segment]] = [[]]
    used = 0
    for part in parts:
        size = sum(len(text) for text, _ in part)
        if lines[-1] and width is not None and used + len(GAP) + size > width:
            lines.append([(INDENT, "")])
            used = len(INDENT)
        elif lines[-1]:
            lines[-1].append((GAP, ""))
            used += len(GAP)
        room = None if width is None else max(1, width - used)
        for text, style in part:
            shown = text if room is None else cut(text, room)
            lines[-1].append((shown, style))
            used += len(shown)
            room = None if room is None else max(1, room - len(shown))
    return [tuple(line) for line in lines]


def wrapped(text: str, width: int | None, *, first: str, then: str, style: Style) -> list[Line]:
    """``text`` broken at spaces to fit ``width``, after ``first`` and then ``then``."""
    if width is None:
        return [((first + text, style),)]
    lines = textwrap.wrap(
        text, max(len(first) + 8, width), initial_indent=first, subsequent_indent=then
    )
    return [((line, style),) for line in lines or [first]]
