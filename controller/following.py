"""One supervised stream per agent target, started and stopped as discovery changes.

Each target gets a :class:`~capwatch.client.node_health.NodeHealthClient` that names the node
it expects (the agent refuses a stream for another node, so a recycled pod IP
never reports the wrong node's health), reconnects for ever with jittered
backoff, and resumes from the last cycle it saw. Every event goes to the
:class:`~capwatch.controller.tracking.NodeTracker`. Followers keep streaming whether
or not this replica leads its shard: a standby is hot, and serves the
cluster stream from the same state.

Dials are paced (``dials``, a :class:`~capwatch.kit.pacing.TokenBucket`: ``--dial-rate`` a
second, a second's worth at once): at a start, or a takeover of a shard's discovery,
thousands of followers begin together, and each opens a connection (a TCP and HTTP/2
handshake, TLS where configured) on the controller's own cores. Paced, 5,000 nodes are
subscribed in ``5,000 / rate`` seconds and a handshake never waits behind thousands
of others; unpaced, how long it takes is whatever the storm makes of it.

A follower task that ends by itself is a bug (the client never gives up: a
message it cannot read is a Disconnected like any failure, retried with the
client's own backoff): it is logged and started again after the one backoff
(:mod:`capwatch.kit.backoff`: full jitter, 1 s doubling to a minute, counted per node
and reset once a follower has run a minute), so one node's failure never stops
the others and a follower that keeps dying does not restart every second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable

from capwatch.client.node_health import NodeHealthClient
from capwatch.controller.tracking import NodeTracker
from capwatch.kit.backoff import Backoff
from capwatch.kit.pacing import TokenBucket

log = logging.getLogger(__name__)

RESTART_BACKOFF = Backoff(initial_s=1.0, max_s=60.0)

ClientFactory = Callable[[str, str], NodeHealthClient]  # (node, address) -> client


class Followers:
    def __init__(
        self,
        *,
        tracker: NodeTracker,
        clients: ClientFactory,
        backoff: Backoff = RESTART_BACKOFF,
        rng: random.Random | None = None,
        dials: TokenBucket | None = None,
    ) -> None:
        """``dials``: the pace at which followers may open their streams (None: at once)."""
        self._tracker = tracker
        self._clients = clients
        self._dials = dials
        self._backoff = backoff
        self._rng = rng or random.Random()
        self._tasks: dict[str, tuple[str, asyncio.Task[None]]] = {}
        self._started: dict[str, float] = {}  # loop time each node's follower started
        # Per node: the address its followers died at, and how many times in a row.
        self._failures: dict[str, tuple[str, int]] = {}
        self._closing = False

    def __len__(self) -> int:
        return len(self._tasks)

    def target(self, node: str, address: str | None) -> None:
        """Follow ``node`` at ``address`` (None: stop following it)."""
        current = self._tasks.get(node)
        if current is not None and current[0] == address:
            return
        if current is not None:
            current[1].cancel()
            del self._tasks[node]
            self._started.pop(node, None)
        if address is None:
            self._failures.pop(node, None)
        if address is None or self._closing:
            return
        task = asyncio.create_task(self._follow(node, address), name=f"capwatch-follow-{node}")
        self._tasks[node] = (address, task)
        self._started[node] = asyncio.get_running_loop().time()
        task.add_done_callback(lambda done: self._supervise(node, address, done))

    async def _follow(self, node: str, address: str) -> None:
        if self._dials is not None:
            await self._dials.take()
        client = self._clients(node, address)
        try:
            async with contextlib.aclosing(client.events()) as events:
                async for event in events:
                    self._tracker.on_event(node, event)
        finally:
            await client.close()

    def _supervise(self, node: str, address: str, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self._closing:
            return
        current = self._tasks.get(node)
        if current is None or current[1] is not task:
            log.error(
                "stream follower for node=%s ended unexpectedly", node, exc_info=task.exception()
            )
            return
        del self._tasks[node]
        loop = asyncio.get_running_loop()
        ran_s = loop.time() - self._started.pop(node, loop.time())
        where, failures = self._failures.get(node, (address, 0))
        if where != address or ran_s >= self._backoff.max_s:
            failures = 0  # another agent, or it ran a while: not the same failure again
        self._failures[node] = (address, failures + 1)
        delay = self._backoff.delay(failures, self._rng)
        log.error(
            "stream follower for node=%s ended unexpectedly; restarting in %.1fs (failure %d)",
            node,
            delay,
            failures + 1,
            exc_info=task.exception(),
        )
        loop.call_later(delay, lambda: self._restart(node, address))

    def _restart(self, node: str, address: str) -> None:
        # Only if discovery still places the agent there.
        if (
            not self._closing
            and node not in self._tasks
            and self._tracker.target_of(node) == address
        ):
            self.target(node, address)

    async def close(self) -> None:
        """Stop every stream and wait for their clients to close."""
        self._closing = True
        tasks = [task for _, task in self._tasks.values()]
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
