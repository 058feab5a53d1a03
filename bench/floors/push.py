"""The push shape at its floor, bare grpc.aio on both ends: every agent dials the
controller over one long-lived stream, so the controller holds one *server* connection
per node (docs/scale.md), where it holds a client one in the pull shape.

    python -m bench.floors.push server EXPECTED
        one client-streaming call taken per agent: prints ``ready PORT``, then ``open N``
        once EXPECTED streams are open, and serves until SIGTERM;
    python -m bench.floors.push agents PORT COUNT INTERVAL MESSAGE
        COUNT agents, each on a connection of its own, each sending the bytes of the file
        MESSAGE every INTERVAL seconds: prints ``ready COUNT`` once all are connected.

The server takes capwatch's own server options (capwatch.server.listeners.OPTIONS), as
bench/floors/watch_server.py's pull side does.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from bench.shared.children import until_terminated
from capwatch.server.listeners import OPTIONS

REPORT = "/bench.Push/Report"
# A subchannel pool per channel: each agent's channel is a connection of its own.
OWN_CONNECTION = (("grpc.use_local_subchannel_pool", 1),)


async def server(expected: int) -> None:
    """The controller in the push shape, bare: one client-streaming call per agent."""
    streams = 0

    async def report(requests: AsyncIterator[bytes], context: Any) -> bytes:
        nonlocal streams
        streams += 1
        if streams == expected:
            print(f"open {streams}", flush=True)
        async for _ in requests:
            pass
        return b""

    serving = grpc.aio.server(options=OPTIONS)
    serving.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "bench.Push", {"Report": grpc.stream_unary_rpc_method_handler(report)}
            ),
        )
    )
    port = serving.add_insecure_port("127.0.0.1:0")
    await serving.start()
    print(f"ready {port}", flush=True)
    await until_terminated()
    await serving.stop(0)


async def agents(port: int, count: int, interval_s: float, message: bytes) -> None:
    """``count`` agents, each on its own connection, each sending a cycle per interval."""

    async def messages() -> AsyncIterator[bytes]:
        while True:
            yield message
            await asyncio.sleep(interval_s)

    channels = [
        grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=OWN_CONNECTION) for _ in range(count)
    ]
    calls = [channel.stream_unary(REPORT)(messages()) for channel in channels]
    await asyncio.gather(*(channel.channel_ready() for channel in channels))
    print(f"ready {count}", flush=True)
    await until_terminated()
    for call in calls:
        call.cancel()
    await asyncio.gather(*(channel.close() for channel in channels))


def main(argv: list[str]) -> int:
    match argv:
        case ["server", expected]:
            asyncio.run(server(int(expected)))
        case ["agents", port, count, interval, message]:
            asyncio.run(agents(int(port), int(count), float(interval), Path(message).read_bytes()))
        case _:
            print(__doc__, file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
