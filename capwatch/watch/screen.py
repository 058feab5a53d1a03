"""Where ``capwatch watch`` and the demo write: a terminal, or anything else.

On a terminal the current picture (a :class:`~capwatch.watch.tables.Frame`'s block)
is redrawn in place, fitted to the terminal's width and coloured, and lines
of history (a cycle's verdict changing, a disconnect) scroll above it; rich
does the drawing (and honours ``NO_COLOR`` and ``TERM=dumb``). Anywhere else
(a pipe, a file, a log collector) only what changed is printed, as plain
text, as wide as ``COLUMNS`` says or with every column.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Mapping
from typing import Protocol, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from capwatch.kit.flags import is_digits
from capwatch.watch.layout import QUIET, Line, plain
from capwatch.watch.tables import Frame


class Screen(Protocol):
    @property
    def width(self) -> int | None:
        """Characters per line; None: no limit."""
        ...

    @property
    def redraws(self) -> bool:
        """Whether it shows a frame's block (else only its changes: a block need not
        be built)."""
        ...

    def show(self, frame: Frame) -> None:
        """Redraw the frame's block, or print its changes."""
        ...

    def note(self, line: Line) -> None:
        """A line of history, printed whatever the screen."""
        ...

    def close(self) -> None: ...


def screen_for(out: TextIO, environ: Mapping[str, str] | None = None) -> Screen:
    """A redrawing screen on a terminal, a printing one elsewhere."""
    environ = os.environ if environ is None else environ
    console = Console(file=out, highlight=False, soft_wrap=False, emoji=False, markup=False)
    if console.is_terminal and not console.is_dumb_terminal:
        return LiveScreen(console)
    return PrintingScreen(out, width=_columns(environ))


class PrintingScreen:
    """Plain lines, only what changed: a pipe cannot be redrawn."""

    def __init__(self, out: TextIO, *, width: int | None) -> None:
        self._out = out
        self._width = width

    @property
    def width(self) -> int | None:
        return self._width

    redraws = False

    def show(self, frame: Frame) -> None:
        self._write(frame.changes)

    def note(self, line: Line) -> None:
        self._write([line])

    def close(self) -> None:
        return

    def _write(self, lines: Iterable[Line]) -> None:
        text = "".join(plain(line) + "\n" for line in lines)
        if text:
            self._out.write(text)
            self._out.flush()


class LiveScreen:
    """The block redrawn in place below the history; nothing printed twice."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._live: Live | None = None

    @property
    def width(self) -> int:
        return self._console.width

    redraws = True

    def show(self, frame: Frame) -> None:
        for line in frame.notes:
            self.note(line)
        if self._live is None:
            self._live = Live(
                console=self._console,
                auto_refresh=False,  # redrawn when there is something new, not on a timer
                redirect_stdout=False,
                redirect_stderr=False,
                vertical_overflow="ellipsis",
            )
            self._live.start()
        self._live.update(Group(*(_text(line) for line in frame.block)), refresh=True)

    def note(self, line: Line) -> None:
        # While live, rich prints above the block and redraws the block below it. A note
        # is history: wrapped whole, never cut.
        self._console.print(_text(line, wrap=True))

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()  # the last picture stays on the screen
            self._live = None


class NoteStream(io.TextIOBase):
    """A stream whose lines become notes: where log records go while a block is redrawn
    (written to the terminal beside it, they would tear it)."""

    def __init__(self, screen: Screen) -> None:
        self._screen = screen
        self._partial = ""

    def write(self, text: str) -> int:
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            self._screen.note(((line, QUIET),))
        return len(text)


def log_stream(screen: Screen) -> TextIO | None:
    """Where log records should go while ``screen`` is in use; None: stderr, as usual."""
    return NoteStream(screen) if isinstance(screen, LiveScreen) else None  # type: ignore[return-value]


def _text(line: Line, *, wrap: bool = False) -> Text:
    text = Text.assemble(*line, no_wrap=not wrap, overflow="fold" if wrap else "ellipsis")
    text.rstrip()  # the last column's padding
    return text


def _columns(environ: Mapping[str, str]) -> int | None:
    raw = environ.get("COLUMNS", "")
    return int(raw) if is_digits(raw) and int(raw) >= 20 else None
