"""A cycle sooner: what the watches ask when something the next cycle must act on arrives.

The agent cycles every ``--interval`` (15 s by default). A ResourceClaim allocated on
this node, or a pod newly bound to it, asks for a cap that should be in place before
the workload's first process starts, and the kubelet starts it within seconds of the
binding: waiting for the interval would usually be too late. So the claims and pod
informers call :meth:`Nudge.__call__` (from their threads) when such a change
arrives, and the run loop (:class:`capwatch.agent.running.AgentLoop`) runs the next cycle
early: ``SETTLE_S`` after the nudge (a scheduler's claim reservation and binding
arrive together, so one cycle sees both), and never sooner than ``MIN_GAP_S`` after
the previous cycle ended, so a burst of changes costs at most a few cycles a second.
"""

from __future__ import annotations

import asyncio
import threading

SETTLE_S = 0.1
MIN_GAP_S = 0.5


class Nudge:
    """Set from any thread; awaited by the run loop. Nudges before :meth:`bind` wait."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self._early = False  # nudged before the loop was bound
        self.count = 0

    def bind(self) -> asyncio.Event:
        """Bind to the running event loop; the event it sets on each nudge."""
        with self._lock:
            self._loop = asyncio.get_running_loop()
            self._event = asyncio.Event()
            if self._early:
                self._event.set()
            return self._event

    def __call__(self) -> None:
        with self._lock:
            self.count += 1
            loop, event = self._loop, self._event
            if loop is None or event is None:
                self._early = True
                return
        try:
            loop.call_soon_threadsafe(event.set)
        except RuntimeError:  # the loop is closed: the agent is stopping
            return
