"""The HTTP edge (capwatch.server.http.serving, httptools for the parsing) over real sockets: what a
real client gets, the head's size limit and deadline, the write deadline, half-closed
requests, and malformed requests answered without a log line."""

from __future__ import annotations

import asyncio
import http.client
import logging
import socket

import pytest

from capwatch.server.http.serving import HEAD_LIMIT, PathServer, Request, Response
from tests.metrics.support import eventually

pytestmark = pytest.mark.asyncio

BODY = b"ok: last good cycle 0.3s ago\n"


async def ready(request: Request) -> Response:
    return Response(status=200, body=BODY)


async def started(**kwargs) -> PathServer:
    server = PathServer(
        kwargs.pop("routes", {"/readyz": ready}), host="127.0.0.1", port=0, **kwargs
    )
    await server.start()
    return server


async def exchange(port: int, raw: bytes, *, half_close: bool = False) -> bytes:
    """Send ``raw`` on a connection of its own and read until the server closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        if half_close:
            writer.write_eof()
        await writer.drain()
        async with asyncio.timeout(10):  # a hang guard
            return await reader.read()
    finally:
        writer.close()


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


async def trickle(writer: asyncio.StreamWriter, data: bytes) -> int:
    """Send ``data`` a byte every 0.1 s: how many bytes went before the connection broke."""
    for sent, byte in enumerate(data):
        try:
            writer.write(bytes([byte]))
            await writer.drain()
        except ConnectionError:
            return sent
        await asyncio.sleep(0.1)
    return len(data)


def fetch(port: int, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
    """One request with http.client, the standard library's client."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


async def test_a_real_client_gets_the_answers_and_their_headers():
    """http.client's GET gets the body with its type, no-store and Connection: close; HEAD
    gets the length without the body; 404 and 405 (with Allow) have their short bodies."""
    server = await started()
    try:
        got, headers, body = await asyncio.to_thread(fetch, server.port, "GET", "/readyz")
        assert (got, body) == (200, BODY)
        assert headers["content-type"] == "text/plain; charset=utf-8"
        assert headers["cache-control"] == "no-store"
        assert headers["connection"] == "close"
        assert headers["content-length"] == str(len(BODY))
        got, headers, body = await asyncio.to_thread(fetch, server.port, "HEAD", "/readyz")
        assert (got, headers["content-length"], body) == (200, str(len(BODY)), b"")
        got, _, body = await asyncio.to_thread(fetch, server.port, "GET", "/readyz/")
        assert (got, body) == (404, b"not found\n")
        got, headers, body = await asyncio.to_thread(fetch, server.port, "DELETE", "/readyz")
        assert (got, headers["allow"], body) == (405, "GET, HEAD", b"method not allowed\n")
    finally:
        await server.stop()


async def test_the_head_limit_counts_the_whole_head_not_its_lines():
    """A head over HEAD_LIMIT made of lines each far below it is refused with a 400, however
    it arrives in one piece or many lines; a head of several headers
    just under the limit is answered."""
    server = await started()
    try:
        line = b"X-Filler: " + b"a" * 490 + b"\r\n"  # 502 bytes
        start = b"GET /readyz HTTP/1.1\r\nHost: x\r\n"
        under = start + line * ((HEAD_LIMIT - 200) // len(line)) + b"\r\n"
        over = start + line * (HEAD_LIMIT // len(line) + 1) + b"\r\n"
        assert len(under) < HEAD_LIMIT < len(over)
        assert status(await exchange(server.port, under)) == 200
        answer = await exchange(server.port, over)
        assert status(answer) == 400
        assert answer.endswith(b"\r\n\r\nrequest head too large\n")
    finally:
        await server.stop()


async def test_the_head_deadline_runs_from_the_connect_however_the_client_trickles():
    """A client sending its head a byte at a time, never idle for long, is still cut at the
    head deadline counted from its connect, without an answer."""
    server = await started(head_timeout_s=1.0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        head = b"GET /readyz HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 200 + b"\r\n\r\n"
        assert await trickle(writer, head) < len(head)  # 240 bytes: 24 s, were it not cut
        try:
            rest = await reader.read()
        except ConnectionError:  # the write that found it closed reset it
            rest = b""
        assert rest == b""  # no answer
        writer.close()
        await eventually(lambda: server.connections == 0, timeout=10)
    finally:
        await server.stop()


async def test_a_client_that_does_not_read_its_answer_is_cut_at_the_write_deadline(
    caplog: pytest.LogCaptureFixture,
):
    """An answer the client never reads (32 MiB, far past the socket buffers) holds its
    connection only until the write deadline: then it is dropped, quietly, while another
    client is answered meanwhile."""
    big = b"m" * (32 * 1024 * 1024)

    async def large(request: Request) -> Response:
        return Response(status=200, body=big)

    caplog.set_level(logging.WARNING)
    server = await started(routes={"/readyz": ready, "/large": large}, write_timeout_s=1.0)
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, ("127.0.0.1", server.port))
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(b"GET /large HTTP/1.1\r\nHost: x\r\n\r\n")
        await eventually(lambda: server.reading == 0 and server.connections == 1, timeout=10)
        assert (
            status(await exchange(server.port, b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")) == 200
        )
        await eventually(lambda: server.connections == 0, timeout=15)
        received = 0
        try:
            async with asyncio.timeout(10):
                while chunk := await reader.read(1 << 20):
                    received += len(chunk)
        except ConnectionError:
            pass  # dropped with a reset
        assert received < len(big)
        writer.close()
    finally:
        sock.close()
        await server.stop()
    assert caplog.records == []


async def test_a_client_that_half_closes_after_its_request_gets_the_answer():
    """A client that shuts its sending side after the request is still answered; one that
    does so mid-head is closed unanswered."""
    server = await started()
    try:
        request = b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n"
        answer = await exchange(server.port, request, half_close=True)
        assert (status(answer), answer.endswith(BODY)) == (200, True)
        assert await exchange(server.port, request[:20], half_close=True) == b""
    finally:
        await server.stop()


async def test_malformed_requests_are_400_and_write_no_log(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
):
    """Garbage, an unknown HTTP version and an HTTP/1.1 request without Host (RFC 9112)
    get a 400 and log nothing; an HTTP/1.0 request without Host is answered."""
    caplog.set_level(logging.DEBUG)
    server = await started()
    try:
        for raw in (
            b"garbage\r\n\r\n",
            b"GET /readyz HTTP/9.9\r\nHost: x\r\n\r\n",
            b"GET /readyz HTTP/1.1\r\n\r\n",
        ):
            assert status(await exchange(server.port, raw)) == 400, raw
        assert status(await exchange(server.port, b"GET /readyz HTTP/1.0\r\n\r\n")) == 200
    finally:
        await server.stop()
    assert [r for r in caplog.records if not r.name.startswith("asyncio")] == []
    assert capfd.readouterr() == ("", "")
