"""Scratch directories that do not outlive their process, even one that is SIGKILLed.

``tempfile.mkdtemp``'s directory stays behind when its process dies before it
removes it (SIGKILL, the OOM killer). Each directory made here is held
locked (``flock``) by its process for as long as that lives: the kernel drops
the lock however the process ends. Making one first removes the directories
of the same prefix whose lock is free: their process is gone. Only this
user's, and only names this module gives (``<prefix><pid>-<random>``; the pid
is for a person reading the listing, the lock is what is trusted: a pid may
be reused, or belong to another PID namespace sharing the directory).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import tempfile
from pathlib import Path
from types import TracebackType


class ScratchDirectory:
    """A fresh directory ``<parent>/<prefix><pid>-<random>``; :meth:`close` removes it."""

    def __init__(self, prefix: str, *, parent: Path | None = None) -> None:
        parent = Path(tempfile.gettempdir()) if parent is None else parent
        sweep(prefix, parent)
        # Made under a name no sweep matches, locked, then renamed (the lock is the
        # directory's, whatever its name): a sweep never sees it unlocked.
        staging = Path(tempfile.mkdtemp(prefix=f".{prefix}", dir=parent))
        self._fd: int | None = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.path = parent / f"{prefix}{os.getpid()}-{staging.name.removeprefix('.' + prefix)}"
        os.rename(staging, self.path)

    def close(self) -> None:
        """Remove the directory and everything in it; again: nothing."""
        if self._fd is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> Path:
        return self.path

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def sweep(prefix: str, parent: Path | None = None) -> list[Path]:
    """Remove this user's ``prefix`` scratch directories whose process has died; which."""
    parent = Path(tempfile.gettempdir()) if parent is None else parent
    name = re.compile(rf"{re.escape(prefix)}[0-9]+-[a-z0-9_]+")
    removed: list[Path] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        try:
            if not name.fullmatch(entry.name) or not entry.is_dir(follow_symlinks=False):
                continue
            if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:  # gone meanwhile, or not ours to open
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # its process holds it: alive
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
        finally:
            os.close(fd)
    return removed
