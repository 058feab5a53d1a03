"""A kubelet-like client: a generic gRPC call decoded with the kubelet's own classes.

Every message read is checked against what the kubelet expects of any message
(see :meth:`KubeletStream.read`), so each behaviour test also checks those.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.unknown_fields import UnknownFieldSet

from tests.dra.kubelet_api import KubeletApi
from tests.server.harness import NODE, UUIDS

MAX_MESSAGE = 1024  # the kubelet's limit on DeviceHealth.message
DEFAULT_NAMES = tuple(f"gpu-{index}" for index in range(len(UUIDS)))
# 2020-09-13: any unix-seconds value now is above it; milliseconds would be far above now.
UNIX_SECONDS_FLOOR = 1_600_000_000


@dataclass(frozen=True, kw_only=True)
class Received:
    response: Any  # the kubelet's NodeWatchResourcesResponse
    at: float  # time.monotonic() when it arrived

    @property
    def by_name(self) -> dict[str, Any]:
        return {d.device.device_name: d for d in self.response.devices}

    def health(self, api: KubeletApi) -> list[str]:
        """Health names in the order sent (by GPU index)."""
        names = {number: name for name, number in api.health.items()}
        return [names[d.health] for d in self.response.devices]

    @property
    def messages(self) -> list[str]:
        return [d.message for d in self.response.devices]


class KubeletStream:
    """One NodeWatchResources call on the kubelet's method path."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        api: KubeletApi,
        *,
        interval_s: float,
        pool: str = NODE,
        names: Sequence[str] = DEFAULT_NAMES,
    ) -> None:
        self.api = api
        self._pool = pool
        self._names = list(names)
        self._timeout_s = math.ceil(3 * interval_s)
        method = channel.unary_stream(
            api.method,
            request_serializer=api.request.SerializeToString,
            response_deserializer=api.response.FromString,
        )
        self._call = method(api.request())

    async def read(self, timeout: float = 5.0) -> Received:
        """The next message, after checking what the kubelet relies on in every message."""
        response = await asyncio.wait_for(self._call.read(), timeout)
        at = time.monotonic()
        assert response is not grpc.aio.EOF, "the stream ended"
        self._check(response)
        return Received(response=response, at=at)

    async def read_until(
        self, done: Callable[[Received], bool], timeout: float = 5.0
    ) -> list[Received]:
        """Messages up to and including the first for which ``done`` holds."""
        deadline = time.monotonic() + timeout
        seen: list[Received] = []
        while True:
            seen.append(await self.read(max(0.0, deadline - time.monotonic())))
            if done(seen[-1]):
                return seen

    def cancel(self) -> None:
        self._call.cancel()

    def _check(self, response: Any) -> None:
        # The full list each time, in GPU order: the kubelet replaces its view
        # with each message and expires any device a message leaves out.
        assert [d.device.device_name for d in response.devices] == self._names
        assert len(UnknownFieldSet(response)) == 0
        for device in response.devices:
            assert device.device.pool_name == self._pool
            assert device.health in self.api.health.values()
            assert 0 < len(device.message) <= MAX_MESSAGE
            assert device.health_check_timeout_seconds == self._timeout_s
            assert UNIX_SECONDS_FLOOR < device.last_updated_time <= time.time() + 1
            assert len(UnknownFieldSet(device)) == 0
            assert len(UnknownFieldSet(device.device)) == 0
