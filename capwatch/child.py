"""A capwatch command run as a child process that ends when its parent does.

``python -m capwatch.child PARENT_PID ARG...`` runs ``capwatch ARG...`` after
asking the kernel to send it SIGTERM the moment the process that started it
ends, however it ends: a SIGKILL of the parent runs no handler that could
stop its children. On Linux that is ``prctl(PR_SET_PDEATHSIG)``, which
survives the exec of the interpreter but counts the parent's *thread* that
forked the child, so the parent must start it from a thread that lives as
long as it does (the demo starts its shim from the event loop's main
thread); elsewhere a thread polls the parent's pid. The demo runs its
readiness shim this way.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence

from capwatch.kit.flags import is_digits

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_POLL_S = 0.5


def die_with_parent(parent: int) -> None:
    """Arrange for SIGTERM when ``parent`` ends; exit at once if it already has."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"prctl(PR_SET_PDEATHSIG): {os.strerror(error)}")
    else:
        watcher = threading.Thread(
            target=_watch, args=(parent,), name="capwatch-parent-watch", daemon=True
        )
        watcher.start()
    # The parent may have gone before the kernel was told: then no signal will come.
    if os.getppid() != parent:
        sys.exit(f"capwatch: parent {parent} is gone; not starting")


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(_POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)


def main(argv: Sequence[str]) -> int:
    if len(argv) < 2 or not is_digits(argv[0]):
        sys.exit("usage: python -m capwatch.child PARENT_PID CAPWATCH_ARG...")
    die_with_parent(int(argv[0]))
    from capwatch.cli import main as capwatch  # noqa: PLC0415 - only once the guard is set

    return capwatch(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
