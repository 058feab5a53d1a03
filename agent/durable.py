"""Small files that must survive a crash whole: written atomically, read without surprises.

A record is written to a temporary file beside it, fsync'd, renamed over the
record, and the directory fsync'd: a ``kill -9`` or a power cut at any instant
leaves the old record or the new one, never a mix. The temporary file has an
unpredictable name and is created exclusively without following symbolic
links (``O_CREAT | O_EXCL | O_NOFOLLOW``), so a link planted in the state
directory cannot redirect the write to a file elsewhere; it is created with
mode 0600 (the ownership record names pods) and the rename keeps that mode.
A crash between creating and renaming leaves a temporary file behind:
:func:`remove_temporaries` clears them at start.

Reading does not follow a symbolic link either, and refuses anything that is
not a regular file: what a reader gets is the file the writer renamed into
place.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

FILE_MODE = 0o600
DIRECTORY_MODE = 0o700
_TEMPORARY = ".{name}.tmp-"


class NotARegularFile(OSError):
    """The path exists but is a directory, a link, a socket...: not a record."""


def write_atomically(path: Path, payload: bytes) -> None:
    """Replace ``path`` with ``payload`` durably. Raises OSError; the old file then stays."""
    path.parent.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
    tmp = path.with_name(_TEMPORARY.format(name=path.name) + secrets.token_hex(8))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    # The rename is durable only once the directory entry is on disk.
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_regular(path: Path) -> bytes:
    """The bytes of ``path``. Raises FileNotFoundError, NotARegularFile or another OSError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if path.is_symlink():  # ELOOP from O_NOFOLLOW
            raise NotARegularFile(f"{path} is a symbolic link") from exc
        raise
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise NotARegularFile(f"{path} is not a regular file")
        return fh.read()


def remove_temporaries(path: Path) -> list[Path]:
    """Remove temporary files an interrupted :func:`write_atomically` of ``path`` left."""
    prefix = _TEMPORARY.format(name=path.name)
    removed: list[Path] = []
    try:
        entries = list(path.parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        if entry.name.startswith(prefix):
            with contextlib.suppress(OSError):
                entry.unlink()  # unlink never follows a link
                removed.append(entry)
    return removed
