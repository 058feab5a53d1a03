"""How the malformed-request guard (server/malformed.py) passes a server stream through:
as an async generator that grpc iterates and sends itself (writing each message with
``context.write`` cost a third of a 1,000-stream fan-out), closing the handler's
generator at once however the call ends."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from capwatch.server.malformed import MalformedRequests

METHOD = "/test.Streams/Follow"


class Follower:
    """A server stream that sends until cancelled and notes when its generator closed."""

    def __init__(self) -> None:
        self.closed = asyncio.Event()
        self.sent = 0

    async def follow(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        try:
            while True:
                self.sent += 1
                yield request
                await asyncio.sleep(0.01)
        finally:
            self.closed.set()


def handler(follower: Follower) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        "test.Streams",
        {
            "Follow": grpc.unary_stream_rpc_method_handler(
                follower.follow, request_deserializer=bytes, response_serializer=bytes
            )
        },
    )


@pytest.mark.asyncio
async def test_a_guarded_server_stream_is_an_async_generator_grpc_iterates():
    """The guarded handler of a unary-stream method is an async generator function, so grpc
    takes its own path for it (it iterates and sends), not the reader-writer one."""
    guard = MalformedRequests()
    original = grpc.unary_stream_rpc_method_handler(
        Follower().follow, request_deserializer=bytes, response_serializer=bytes
    )

    async def continuation(_: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any]:
        return original

    class Details(grpc.HandlerCallDetails):
        method = METHOD
        invocation_metadata = ()

    details: Any = Details()
    guarded = await guard.intercept_service(continuation, details)
    assert guarded is not None
    assert inspect.isasyncgenfunction(guarded.unary_stream)


@pytest.mark.asyncio
async def test_a_cancelled_guarded_stream_closes_its_handlers_generator():
    """A client cancelling a guarded stream mid-flight closes the handler's generator (its
    finally runs: stream slots are given back), and the server keeps serving."""
    follower = Follower()
    server = grpc.aio.server(interceptors=(MalformedRequests(),))
    server.add_generic_rpc_handlers((handler(follower),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_stream(METHOD)(b"x")
            for _ in range(3):
                assert await call.read() == b"x"
            call.cancel()
            await asyncio.wait_for(follower.closed.wait(), timeout=10)
            follower.closed.clear()
            again = channel.unary_stream(METHOD)(b"y")
            assert await again.read() == b"y"
            again.cancel()
            await asyncio.wait_for(follower.closed.wait(), timeout=10)
    finally:
        await server.stop(0)
