"""Child processes for the control plane that outlive nothing they should not.

Each binary starts in a session (so a process group) of its own, so a signal to
the group reaches anything it forked and a Ctrl-C at the terminal reaches none
of them. A process tied to its parent also gets PR_SET_PDEATHSIG (Linux), so a
pytest run that is SIGKILLed takes its etcd and kube-apiserver with it. Stopping
is SIGTERM, a bounded wait, then SIGKILL.

A :class:`Proc` also names a process started by another Python process (the
``scripts/realkube.py up`` that has exited): its pid plus its start time from
/proc tell it from a later process that reuses the pid, so ``down`` never
signals a stranger.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1
POLL_S = 0.05
KILL_WAIT_S = 5.0


class ProcessError(Exception):
    """A process could not be started or stopped; the message is one line."""


@dataclass(frozen=True)
class Proc:
    """A started process: its name, pid, start time (clock ticks since boot) and log."""

    name: str
    pid: int
    start_ticks: int
    log: Path

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pid": self.pid,
            "start_ticks": self.start_ticks,
            "log": str(self.log),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Proc:
        return cls(
            name=str(data["name"]),
            pid=int(data["pid"]),
            start_ticks=int(data["start_ticks"]),
            log=Path(data["log"]),
        )


def start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat, or None when there is no such live process.

    A zombie counts as gone: it has exited, and whether anyone reaps it (a
    container's init may not) is no business of ours.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    if len(fields) < 20 or fields[0] in {"Z", "X"}:
        return None
    return int(fields[19])


def alive(proc: Proc) -> bool:
    """Whether proc is still running and is the process that was started."""
    return start_ticks(proc.pid) == proc.start_ticks


def _die_with_parent() -> Callable[[], None]:
    """A preexec_fn that makes the child die when the thread that forks it dies."""
    parent = os.getpid()
    # Loaded before the fork: dlopen in a forked child of a threaded parent can deadlock.
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # The parent may have died between fork and prctl: then no signal comes.
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def spawn(
    name: str,
    argv: Sequence[str],
    log: Path,
    *,
    tie_to_parent: bool,
    env: Mapping[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], Proc]:
    """Start argv with stdout and stderr appended to log, in a session of its own.

    tie_to_parent: PR_SET_PDEATHSIG, for processes that must not outlive this
    one (tests). Leave it off for processes meant to run on after this Python
    process exits (``scripts/realkube.py up``). PR_SET_PDEATHSIG fires when the
    *thread* that forked exits, so call this from a thread that lives as long
    as the processes should (pytest's main thread does).
    """
    preexec = _die_with_parent() if tie_to_parent and sys.platform == "linux" else None
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        try:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=preexec,  # noqa: PLW1509 - prctl must run in the child
                env=dict(env) if env is not None else None,
                close_fds=True,
            )
        except OSError as err:
            raise ProcessError(f"cannot start {name} ({argv[0]}): {err.strerror}") from None
    ticks = start_ticks(popen.pid)
    if ticks is None:
        # It exited already (bad flags, usually); the caller reads the log.
        ticks = -1
    return popen, Proc(name=name, pid=popen.pid, start_ticks=ticks, log=log)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal the process group that pid leads (spawn made it a leader)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _wait_gone(proc: Proc, popen: subprocess.Popen[bytes] | None, timeout: float) -> bool:
    """Wait up to timeout for proc to exit (reaping it when it is our child)."""
    if popen is not None:
        try:
            popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    deadline = time.monotonic() + timeout
    while alive(proc):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


def stop(proc: Proc, popen: subprocess.Popen[bytes] | None = None, *, grace: float = 10.0) -> None:
    """SIGTERM proc's group, wait up to grace seconds, then SIGKILL; return once it is gone.

    With popen (our own child) the process is also reaped, so no zombie remains.
    """
    running = popen.poll() is None if popen is not None else alive(proc)
    if not running:
        # Long gone: its pid (and group id) may belong to a stranger by now.
        return
    _signal_group(proc.pid, signal.SIGTERM)
    if not _wait_gone(proc, popen, grace):
        _signal_group(proc.pid, signal.SIGKILL)
        if not _wait_gone(proc, popen, KILL_WAIT_S):
            raise ProcessError(f"{proc.name} (pid {proc.pid}) survived SIGKILL")
    # Anything it forked into its group dies with it (these binaries fork nothing
    # today); the group id cannot be reused while a member is left.
    _signal_group(proc.pid, signal.SIGKILL)


def group_empty(pid: int) -> bool:
    """Whether no process is left in the process group that pid led."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    # A zombie leader still counts for killpg; look for any live member.
    return not any(
        _pgid(int(entry)) == pid and start_ticks(int(entry)) is not None
        for entry in os.listdir("/proc")
        if entry.isdigit()
    )


def _pgid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[2]) if len(fields) > 2 else None


def tail(path: Path, lines: int = 25) -> str:
    """The last lines of a log, for error messages ('' when there is none)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
