"""What a long-lived task's end means: the one rule every server's tasks follow.

A task of a running server ends only when the server stops it. Cancelled, or ended
while its owner is stopping, is the ordered shutdown; any other end (an exception,
or returning on its own) is logged once with the task's name and makes the process
stop (``on_fatal``): a half-running agent would publish or enforce less than it says.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable


def ended(
    task: asyncio.Task[None],
    *,
    stopping: bool,
    on_fatal: Callable[[], None],
    log: logging.Logger,
    expected: Callable[[], bool] = lambda: False,
) -> None:
    """A done-callback's body for ``task``; ``expected`` says whether a clean return is
    the owner's own doing (the hub released its readers, say)."""
    if task.cancelled() or stopping:
        return
    exc = task.exception()
    if exc is None and expected():
        return
    log.error("task %s ended unexpectedly; stopping", task.get_name(), exc_info=exc)
    on_fatal()
