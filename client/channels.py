"""Channels shared by the streams of many clients to one address.

A controller follows one stream per node. Where nodes share an address -- a
pool of simulated nodes, or agents behind a proxy -- each client opening its
own channel means a TCP connection and grpc's per-connection state (about
30 KiB) per node; sharing one channel per address puts every node's stream on
one HTTP/2 connection instead (measured at 5,000 streams: 31 KiB per stream
shared, 60 KiB each on its own). Where every node has its own address (agents
in a cluster) nothing changes.

A shared channel outlives the failure of any one stream on it: a client whose
stream ends calls again on the same channel, and grpc reconnects the channel
itself when the server comes back, with its reconnect backoff held to 0.2-10 s
(its default grows to two minutes) so that a pool restarted behind the same
address is found as quickly as a client's own backoff would find it. The
minimum connect timeout stays grpc's 20 s: grpc reads
``grpc.min_reconnect_backoff_ms`` as the least time a connection attempt is
given, and at 0.2 s a controller dialling thousands of agents at once saw its
handshakes time out and start again for as long as the storm they made lasted
(bench/scenarios/connection_floor.py --variants: 1,000 bare channels never all connected
in 60 s; without it 3,000 connected in 1.6 s). A channel is closed when its
last client releases it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

RECONNECT_OPTIONS: Sequence[tuple[str, Any]] = (
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 10_000),
)


class SharedChannels:
    """One channel per target, counted by the clients holding it."""

    def __init__(
        self,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self._credentials = credentials
        self._options = tuple({**dict(options), **dict(RECONNECT_OPTIONS)}.items())
        self._channels: dict[str, tuple[grpc.aio.Channel, int]] = {}

    def __len__(self) -> int:
        return len(self._channels)

    def acquire(self, target: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
        """The channel to ``target`` (opened with ``options`` if it is the first)."""
        held = self._channels.get(target)
        if held is None:
            merged = tuple({**dict(options), **dict(self._options)}.items())
            channel = (
                grpc.aio.insecure_channel(target, options=merged)
                if self._credentials is None
                else grpc.aio.secure_channel(target, self._credentials, options=merged)
            )
            self._channels[target] = (channel, 1)
            return channel
        self._channels[target] = (held[0], held[1] + 1)
        return held[0]

    async def release(self, target: str) -> None:
        """One client is done with ``target``'s channel; the last one closes it."""
        held = self._channels.get(target)
        if held is None:
            return
        if held[1] > 1:
            self._channels[target] = (held[0], held[1] - 1)
            return
        del self._channels[target]
        await held[0].close()

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for channel, _ in channels.values():
            await channel.close()
