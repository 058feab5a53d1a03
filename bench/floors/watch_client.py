"""The floor for the controller's memory: a bare grpc.aio client holding one connection
per node, each with the same capwatch.v1 Watch stream open and read.

``python -m bench.floors.watch_client TARGETS [OPTIONS]`` (``NODE ADDRESS`` per line;
OPTIONS a JSON list of ``[name, value]`` channel arguments) opens a channel per address
and a Watch per node, prints ``subscribed N SECONDS`` once every stream has had its first
message, and reads until SIGTERM. Its RSS is what holding the connections costs before
anything capwatch's controller keeps per node.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import grpc

from bench.shared.children import until_terminated
from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.api.gen.capwatch.v1 import node_health_pb2_grpc as pb_grpc


async def follow(channel: grpc.aio.Channel, node: str, first: asyncio.Event) -> None:
    stub = pb_grpc.NodeHealthServiceStub(channel)
    async for _ in stub.Watch(pb.WatchRequest(node_name=node)):
        first.set()


async def hold(pairs: list[list[str]], options: list[tuple[str, Any]]) -> int:
    started = time.monotonic()
    channels = {
        address: grpc.aio.insecure_channel(address, options=options) for _, address in pairs
    }
    firsts = [asyncio.Event() for _ in pairs]
    tasks = [
        asyncio.create_task(follow(channels[address], node, first))
        for (node, address), first in zip(pairs, firsts, strict=True)
    ]
    await asyncio.gather(*(first.wait() for first in firsts))
    print(f"subscribed {len(pairs)} {time.monotonic() - started:.2f}", flush=True)
    await until_terminated()
    for task in tasks:
        task.cancel()
    for channel in channels.values():
        await channel.close()
    return 0


def main(argv: list[str]) -> int:
    text = Path(argv[0]).read_text()
    given = [(str(k), v) for k, v in json.loads(argv[1])] if len(argv) > 1 else []
    return asyncio.run(hold([line.split() for line in text.splitlines() if line.strip()], given))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
