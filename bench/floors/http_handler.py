"""The readiness shim's floor: the least an HTTP server can do on the same stack.

An ``asyncio.start_server`` handler (stdlib only, a process of its own) reads the request
head and writes a fixed 200 of the shim's size with ``Connection: close``: the same event
loop, the same stream classes, the same connection per request as ``capwatch shim``, so
bench/scenarios/readyz.py's ratio is the cost of the shim's own work (parsing, deadlines,
eviction bookkeeping, the readiness rule) and not of another architecture;
``http.server`` would be a thread per connection, slower, and flatter the ratio.

    python -m bench.floors.http_handler      # prints its port, serves until SIGTERM
"""

from __future__ import annotations

import asyncio

from bench.shared.children import until_terminated

HOST = "127.0.0.1"
# The shim's 200, byte for byte in size: "ok: last good cycle 0.3s ago\n".
BODY = b"ok: last good cycle 0.3s ago\n"
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: %d\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n%s"
    % (len(BODY), BODY)
)


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(RESPONSE)
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def serve() -> None:
    """Serve the fixed 200 on an ephemeral port (printed first) until SIGTERM."""
    server = await asyncio.start_server(_answer, HOST, 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await until_terminated()
    server.close()
    await server.wait_closed()


if __name__ == "__main__":
    asyncio.run(serve())
