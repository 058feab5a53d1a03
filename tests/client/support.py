"""Small helpers shared by the client tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc


async def eventually(condition: Callable[[], object], *, timeout: float = 2.0) -> None:
    """Wait until ``condition()`` holds; fail after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110 (state owned by the code under test)
            await asyncio.sleep(0.01)


class Script:
    """What each Watch call is answered with: messages, then the stream held open."""

    def __init__(self, messages: Callable[[], list[bytes]]) -> None:
        self.messages = messages
        self.calls = 0

    async def watch(self, request: Any, context: Any) -> AsyncIterator[bytes]:
        self.calls += 1
        for message in self.messages():
            yield message
        await asyncio.Event().wait()  # held open: only the client ends it


@contextlib.asynccontextmanager
async def scripted(service: str, method: str, script: Script) -> AsyncIterator[str]:
    """A gRPC server on 127.0.0.1:0 answering ``service``/``method`` (server streaming)
    by ``script``; its target."""
    server = grpc.aio.server()
    handler = grpc.unary_stream_rpc_method_handler(
        script.watch, request_deserializer=None, response_serializer=None
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service, {method: handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)
