"""The /readyz HTTP server: status codes, no access log, bind failure, abusive clients."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from capwatch.server.http.readyz import Answer, ReadyzServer

pytestmark = pytest.mark.asyncio


async def request(port: int, raw: bytes, timeout: float = 2.0) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), timeout)
    writer.close()
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1]


def get(path: str, method: str = "GET") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()


async def started(answer: Answer, **kwargs) -> ReadyzServer:
    server = ReadyzServer(lambda: answer, host="127.0.0.1", port=0, **kwargs)
    await server.start()
    return server


async def test_status_codes_and_bodies():
    """GET /readyz gives the answer; other paths 404; other methods 405; HEAD has no body."""
    server = await started(Answer(status=503, body="not ready: stale\n"))
    try:
        assert await request(server.port, get("/readyz")) == (503, b"not ready: stale\n")
        assert await request(server.port, get("/readyz?verbose=1")) == (503, b"not ready: stale\n")
        assert (await request(server.port, get("/healthz")))[0] == 404
        assert (await request(server.port, get("/")))[0] == 404
        assert (await request(server.port, get("/readyz", "POST")))[0] == 405
        assert await request(server.port, get("/readyz", "HEAD")) == (503, b"")
        assert (await request(server.port, b"garbage\r\n\r\n"))[0] == 400
    finally:
        await server.stop()


async def test_no_log_line_per_request(caplog: pytest.LogCaptureFixture, capfd):
    """Probes write nothing: no access log on stderr or through logging."""
    server = await started(Answer(status=200, body="ok\n"))
    caplog.set_level(logging.DEBUG)
    try:
        for _ in range(5):
            assert (await request(server.port, get("/readyz")))[0] == 200
    finally:
        await server.stop()
    assert caplog.records == []
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


async def test_occupied_port_is_fatal():
    """Binding a port another socket listens on raises instead of sharing it."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        server = ReadyzServer(
            lambda: Answer(status=200, body=""), host="127.0.0.1", port=holder.getsockname()[1]
        )
        with pytest.raises(OSError, match="address already in use"):
            await server.start()
    finally:
        holder.close()


async def test_silent_clients_cannot_starve_the_probe():
    """With every slot held by clients that never send, a probe is still answered: the
    oldest squatter is evicted for it, rather than the probe waiting for a squatter's
    head deadline (a minute here). 20 squatters on 8 slots evict exactly 12 of
    themselves; the probe evicts exactly one more."""
    server = await started(Answer(status=200, body="ok\n"), max_connections=8, head_timeout_s=60)
    squatters = []
    try:
        for _ in range(20):
            squatters.append(await asyncio.open_connection("127.0.0.1", server.port))
        # Every squatter accepted: the slots are full (a hang guard, not a bound).
        async with asyncio.timeout(10):
            while (server.evicted, server.reading) != (12, 8):  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        # The timeout is a hang guard, far inside the squatters' 60 s deadline: no
        # squatter timed out, so the answer came by eviction.
        assert (await request(server.port, get("/readyz"), timeout=10))[0] == 200
        assert server.evicted == 13
    finally:
        for _, writer in squatters:
            writer.close()
        await server.stop()


async def test_slow_head_times_out_and_huge_head_is_refused():
    """A client trickling its head is cut at the deadline; an oversized head gets 400."""
    server = await started(Answer(status=200, body="ok\n"), head_timeout_s=0.2)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /readyz HTTP/1.1\r\n")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 2) == b""  # closed without an answer
        writer.close()
        huge = b"GET /readyz HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n"
        assert (await request(server.port, huge))[0] == 400
    finally:
        await server.stop()


async def test_a_burst_of_real_clients_is_served_in_full():
    """100 clients arriving at once with complete requests all get their answer: the
    eviction meant for silent clients must not drop a burst of honest ones."""
    server = await started(Answer(status=200, body="ok\n"))
    try:
        results = await asyncio.gather(*(request(server.port, get("/readyz")) for _ in range(100)))
    finally:
        await server.stop()
    assert [status for status, _ in results] == [200] * 100
    assert server.evicted == 0


async def test_stop_ends_open_connections_quietly(caplog: pytest.LogCaptureFixture):
    """Stopping with connections still open (all ten accepted, not merely given time to
    be) closes them without an error logged."""
    server = await started(Answer(status=200, body="ok\n"))
    idle = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(10)]
    async with asyncio.timeout(10):  # a hang guard, not a bound
        while server.connections != 10:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    caplog.set_level(logging.DEBUG)
    await server.stop()
    for reader, writer in idle:
        assert await asyncio.wait_for(reader.read(), 2) == b""
        writer.close()
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
