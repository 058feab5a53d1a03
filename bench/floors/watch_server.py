"""Bare grpc.aio servers of capwatch.v1 Watch: the least a server can do to send the bytes
capwatch's Watch sends.

- :class:`BareWatch`, the stream bench's floors: every stream sent the same serialized
  message, in a loop as fast as grpc takes it (``forever``: the throughput floor), or once
  per :meth:`BareWatch.publish`, one message serialized once for every stream (the
  fan-out floor: a bare broadcast);
- ``python -m bench.floors.watch_server MESSAGE NODES INTERVAL``, the pull shape's
  connections at their floor (bench/scenarios/connection_floor.py): one server listening
  at every node's own loopback address (bench.shared.addresses), all on one port,
  sending each stream the bytes of the file MESSAGE every INTERVAL seconds; it prints
  ``ready PORT`` and serves until SIGTERM.

Both take capwatch's own server options (capwatch.server.listeners.OPTIONS), as the
agent's and the controller's servers do: grpc core otherwise fails all but 1,000 calls
not yet matched to a handler, and 5,000 arrive at once.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from bench.shared.addresses import node_address
from bench.shared.children import until_terminated
from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.server.listeners import OPTIONS

SERVICE = "capwatch.v1.NodeHealthService"


class BareWatch:
    """One bare Watch server sending ``message`` (a cycle, as capwatch's Watch maps one)."""

    def __init__(self, message: pb.WatchResponse) -> None:
        self.message = message
        self.payload = message.SerializeToString()
        self.event = asyncio.Event()
        self.sequence = 0
        self.sent = self.streams = 0
        self.server: grpc.aio.Server | None = None

    async def start(self, *, forever: bool) -> str:
        """Serve on 127.0.0.1; the target to dial."""
        opening = pb.WatchResponse(snapshot=pb.NodeSnapshot(node_name="x")).SerializeToString()

        async def watch(request: pb.WatchRequest, context: object) -> AsyncIterator[bytes]:
            if forever:  # the same bytes, as fast as grpc takes them
                payload = self.payload
                while True:
                    self.sent += 1
                    yield payload
            # The least a broadcast can do: wait for the next message, send shared bytes.
            self.streams += 1
            try:
                yield opening
                seen = self.sequence
                while True:
                    while self.sequence == seen:
                        await self.event.wait()
                    seen = self.sequence
                    self.sent += 1
                    yield self.payload
            finally:
                self.streams -= 1

        handler = grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Watch": grpc.unary_stream_rpc_method_handler(
                    watch, request_deserializer=pb.WatchRequest.FromString
                )
            },
        )
        self.server = grpc.aio.server(options=OPTIONS)
        self.server.add_generic_rpc_handlers((handler,))
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return f"127.0.0.1:{port}"

    def publish(self) -> None:
        """The next cycle: one new message, serialized once, the same bytes for every
        stream, finished now (the readers' latency runs from here)."""
        self.sequence += 1
        self.message.cycle.sequence = self.sequence
        self.message.cycle.finished.FromNanoseconds(time.time_ns())
        self.payload = self.message.SerializeToString()
        self.event.set()
        self.event = asyncio.Event()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0.5)


async def serve_every_node(message: bytes, nodes: int, interval_s: float) -> None:
    """A bare Watch server at every node's own address, all on one port."""

    async def watch(request: bytes, context: Any) -> AsyncIterator[bytes]:
        while True:
            yield message
            await asyncio.sleep(interval_s)

    server = grpc.aio.server(options=OPTIONS)
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE, {"Watch": grpc.unary_stream_rpc_method_handler(watch)}
            ),
        )
    )
    port = server.add_insecure_port(f"{node_address(0)}:0")
    for i in range(1, nodes):
        if server.add_insecure_port(f"{node_address(i)}:{port}") != port:
            raise SystemExit(f"pull server: cannot listen on {node_address(i)}:{port}")
    await server.start()
    print(f"ready {port}", flush=True)
    await until_terminated()
    await server.stop(0)


def main(argv: list[str]) -> int:
    message, nodes, interval = argv
    asyncio.run(serve_every_node(Path(message).read_bytes(), int(nodes), float(interval)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
