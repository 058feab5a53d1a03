"""Requests whose bytes are not their method's message: INVALID_ARGUMENT and one line.

grpc parses a request before any servicer sees it. When the bytes do not
parse, grpc.aio logs the DecodeError at ERROR with its traceback (seven lines)
and answers UNKNOWN; a client sending garbage in a loop wrote 14,004 lines for
2,000 requests. :class:`MalformedRequests`, an interceptor on the agent's
server and on the controller's cluster stream (generic server plumbing, like
:mod:`capwatch.server.listeners`, so both may use it), gives every method of every
service (capwatch.v1, the DRA mirrors, grpc health, reflection) a deserializer
that returns a marker instead of raising, and ends a call that gets one with
INVALID_ARGUMENT ("malformed request: Error parsing message with type ...").
Each is counted (the agent's ``capwatch_grpc_malformed_requests_total``) and
logged as one line without a traceback, through the throttle in
:mod:`capwatch.kit.throttling`.

Failed TLS handshakes never reach Python: grpc core logs them, one line each
at INFO, unless told otherwise before it loads (see :mod:`capwatch`).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from capwatch.kit.throttling import ThrottledLog

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]


class Malformed:
    """What a guarded deserializer returns for bytes that do not parse."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def tolerant(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """``deserializer``, returning a :class:`Malformed` where it would raise DecodeError."""

    def deserialize(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except DecodeError as exc:
            return Malformed(str(exc))

    return deserialize


class MalformedRequests(grpc.aio.ServerInterceptor):
    """Refuses malformed requests on every method it can guard (async handlers with a
    deserializer; anything else is passed on as it is)."""

    def __init__(self) -> None:
        self.count = 0
        self._log = ThrottledLog(log)
        # By method: the handler as resolved, and its guarded twin.
        self._guarded: dict[str, tuple[grpc.RpcMethodHandler[Any, Any], Any]] = {}

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = handler_call_details.method
        cached = self._guarded.get(method)
        if cached is None or cached[0] is not handler:
            cached = (handler, self._guard(handler, method))
            self._guarded[method] = cached
        guarded: grpc.RpcMethodHandler[Any, Any] = cached[1]
        return guarded

    async def _refuse(self, request: Malformed, method: str, context: Context) -> None:
        self.count += 1
        self._log.warning(
            "malformed request refused method=%s peer=%s: %s",
            method,
            context.peer(),
            request.reason,
        )
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {request.reason}"
        )

    def _guard(self, handler: grpc.RpcMethodHandler[Any, Any], method: str) -> Any:
        assert handler.request_deserializer is not None
        deserializer = tolerant(handler.request_deserializer)
        serializer = handler.response_serializer
        refuse = self._refuse
        streaming_in, streaming_out = handler.request_streaming, handler.response_streaming

        async def checked(requests: AsyncIterator[Any], context: Context) -> AsyncIterator[Any]:
            async for request in requests:
                if isinstance(request, Malformed):
                    await refuse(request, method, context)
                yield request

        async def accepted(request: Any, context: Context) -> Any:
            """The request (or request iterator) to hand the servicer."""
            if streaming_in:
                return checked(request, context)
            if isinstance(request, Malformed):
                await refuse(request, method, context)
            return request

        # Typed for the synchronous API by grpc's stubs; on this server, async.
        behavior: Any
        if streaming_in:
            behavior = handler.stream_stream if streaming_out else handler.stream_unary
        else:
            behavior = handler.unary_stream if streaming_out else handler.unary_unary

        async def stream_through(request: Any, context: Context) -> AsyncIterator[Any]:
            # An async generator, so that grpc iterates it and sends each
            # response itself: writing them with context.write instead cost 10 us
            # a message, a third of a 1,000-stream fan-out (bench/scenarios/stream.py). The
            # handler's generator is closed with this one, which grpc drops when
            # the call ends, cancelled or not (the loop's async-generator hook
            # closes it then); its finally clauses give back stream slots
            # (tests/server/test_malformed_streams.py).
            responses = behavior(await accepted(request, context), context)
            async with contextlib.aclosing(responses):
                async for response in responses:
                    yield response

        async def call_through(request: Any, context: Context) -> Any:
            return await behavior(await accepted(request, context), context)

        if inspect.isasyncgenfunction(behavior):
            guarded: Callable[[Any, Context], Any] = stream_through
        elif inspect.iscoroutinefunction(behavior):
            guarded = call_through
        else:  # a synchronous handler (none here): left to grpc
            return handler
        if streaming_in and streaming_out:
            return grpc.stream_stream_rpc_method_handler(guarded, deserializer, serializer)
        if streaming_in:
            return grpc.stream_unary_rpc_method_handler(guarded, deserializer, serializer)
        if streaming_out:
            return grpc.unary_stream_rpc_method_handler(guarded, deserializer, serializer)
        return grpc.unary_unary_rpc_method_handler(guarded, deserializer, serializer)
