"""Run a command on a pseudo-terminal of a given size, and read what it drew."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time
from collections.abc import Callable, Mapping, Sequence

# Control sequences: CSI (colours, cursor moves, erases) and OSC.
_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[()][0-9A-Za-z]")
RED = re.compile(r"\x1b\[(?:[0-9]+;)*31(?:;[0-9]+)*m")
# How rich's Live moves back over what it drew: erase the line, cursor up.
REDRAW = "\x1b[2K\x1b[1A"


def terminal_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` as a colour terminal's: the size comes from the terminal itself."""
    env = {k: v for k, v in environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    env["TERM"] = "xterm-256color"
    return env


def spawn(
    argv: Sequence[str], *, columns: int, rows: int = 50, env: Mapping[str, str]
) -> tuple[subprocess.Popen[bytes], int]:
    """The command with stdin, stdout and stderr on a new terminal; and its master end."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    try:
        process = subprocess.Popen(
            list(argv), stdin=slave, stdout=slave, stderr=slave, env=dict(env), close_fds=True
        )
    finally:
        os.close(slave)
    return process, master


def read_until_exit(process: subprocess.Popen[bytes], master: int, timeout: float) -> str:
    """Everything drawn until the command exits (killed after ``timeout`` seconds)."""
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if not ready:
                if process.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the terminal's other end is closed
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
    return b"".join(chunks).decode("utf-8", "replace")


def read_until(master: int, done: Callable[[str], bool], timeout: float, drawn: str = "") -> str:
    """What is drawn, after ``drawn`` (an earlier call's answer), until ``done`` holds for
    all of it; fails after ``timeout`` seconds. The terminal stays open."""
    chunks = [drawn.encode()]
    deadline = time.monotonic() + timeout
    while not done(text := b"".join(chunks).decode("utf-8", "replace")):
        assert time.monotonic() < deadline, visible_lines(text)[-40:]
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            chunks.append(os.read(master, 65536))
    return text


def visible_lines(drawn: str) -> list[str]:
    """The text of every line as drawn, control sequences removed (a carriage return
    starts the line again)."""
    return [
        piece for line in _CONTROL.sub("", drawn).split("\n") for piece in line.split("\r") if piece
    ]
