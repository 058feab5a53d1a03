"""The client side of the stream bench: Watch streams over channels of their own.

A :class:`ClientSide` lives in a spawned client process (bench.shared.children.Child),
driven one command at a time: it measures throughput, opens reading or never-reading
subscribers, and collects publish -> receive latencies.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import grpc

from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb

WATCH = "/capwatch.v1.NodeHealthService/Watch"
# A subchannel pool per channel: each channel is a connection of its own.
CLIENT_OPTIONS = (("grpc.use_local_subchannel_pool", 1),)


class ClientSide:
    """Lives in a client process: Watch streams over channels of their own."""

    def __init__(self) -> None:
        self.channels: list[grpc.aio.Channel] = []
        self.calls: list[Any] = []
        self.readers: list[asyncio.Task[None]] = []
        self.latencies: list[list[float]] = []
        self.snapshots = 0

    def _watch(
        self, channel: grpc.aio.Channel, parse: Callable[[bytes], Any], since: int = 0
    ) -> Any:
        return channel.unary_stream(
            WATCH, request_serializer=pb.WatchRequest.SerializeToString, response_deserializer=parse
        )(pb.WatchRequest(since_sequence=since))

    async def throughput(
        self, target: str, warmup_s: float, measure_s: float, since: int = 0
    ) -> dict[str, float]:
        """Cycle messages received per second after a warm-up: one loop for any server.
        ``since`` > 0 resumes from the ring (the "replay" server)."""
        size = [0]

        def parse(data: bytes) -> pb.WatchResponse:
            size[0] += len(data)
            return pb.WatchResponse.FromString(data)

        cycles = others = 0
        first: tuple[int, int, float, float] | None = None
        async with grpc.aio.insecure_channel(target, options=CLIENT_OPTIONS) as channel:
            call = self._watch(channel, parse, since)
            mark = time.perf_counter() + warmup_s
            async with asyncio.timeout(warmup_s + measure_s + 20):
                async for message in call:
                    if message.WhichOneof("event") == "cycle":
                        cycles += 1
                    else:
                        others += 1
                    now = time.perf_counter()
                    if first is None and now >= mark:
                        first = (cycles, size[0], now, time.process_time())
                    elif first is not None and now >= first[2] + measure_s:
                        break
            call.cancel()
        assert first is not None
        count, seconds = cycles - first[0], now - first[2]
        return {
            "per_s": count / seconds,
            "bytes": (size[0] - first[1]) / count,
            "non_cycle": others,
            "cpu": (time.process_time() - first[3]) / seconds,
        }

    async def open(self, target: str, streams: int, channels: int, reading: bool) -> int:
        """Open Watch streams; reading ones record each cycle's publish->receive seconds."""
        new = [grpc.aio.insecure_channel(target, options=CLIENT_OPTIONS) for _ in range(channels)]
        self.channels += new
        parse = pb.WatchResponse.FromString
        calls = [self._watch(new[i % channels], parse) for i in range(streams)]
        self.calls += calls
        async with asyncio.timeout(60):
            if not reading:  # headers come with the snapshot, which is left unread
                await asyncio.gather(*(call.initial_metadata() for call in calls))
                return len(calls)
            before = self.snapshots
            for call in calls:
                samples: list[float] = []
                self.latencies.append(samples)
                self.readers.append(asyncio.create_task(self._read(call, samples)))
            while self.snapshots - before < streams:  # noqa: ASYNC110 - a few polls, once
                await asyncio.sleep(0.01)
        return len(calls)

    async def _read(self, call: Any, samples: list[float]) -> None:
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            async for message in call:
                received = time.time()  # the publisher's clock: same machine, same wall clock
                if message.WhichOneof("event") == "cycle":
                    finished = message.cycle.finished
                    samples.append(received - finished.seconds - finished.nanos / 1e9)
                else:
                    self.snapshots += 1

    async def collect(self, cycles: int, timeout_s: float) -> tuple[list[float], int]:
        """Every latency since the last collect (waiting for ``cycles`` per stream), and
        short streams."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(len(s) < cycles for s in self.latencies):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        short = sum(len(s) < cycles for s in self.latencies)
        collected = [x for s in self.latencies for x in s]
        for samples in self.latencies:  # the readers' own lists: emptied, not replaced
            samples.clear()
        return collected, short

    async def close(self) -> None:
        for call in self.calls:
            call.cancel()
        for task in self.readers:
            task.cancel()
        await asyncio.gather(*self.readers, return_exceptions=True)
        await asyncio.gather(*(channel.close() for channel in self.channels))
        self.channels, self.calls, self.readers, self.latencies = [], [], [], []

    async def stop(self) -> None:
        await self.close()
