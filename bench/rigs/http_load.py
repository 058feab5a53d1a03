"""Load for ``GET /readyz``: ``wrk`` where installed (Debian: ``apt-get install wrk``), else
a Python asyncio generator in a process of its own.

Either way each of the concurrent clients does connect, GET (with ``Connection: close``,
as the kubelet's prober sends), read the answer, close, in a loop: a connection per
request, as probes arrive. A run's figures are a :class:`Load`. wrk's latency runs from
writing the request to the end of the answer (the connect is not in it); the Python
generator's from the connect. On 2 cores the Python generator saturates before either
server does, so a ratio measured with it is near 1 whatever the server costs.

    python -m bench.rigs.http_load --port PORT --clients N --seconds S
        the Python generator: prints its Load's fields as JSON
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

HOST = "127.0.0.1"
REQUEST = b"GET /readyz HTTP/1.1\r\nHost: bench\r\nUser-Agent: bench\r\nConnection: close\r\n\r\n"
WRK_SCRIPT = """
wrk.headers["Connection"] = "close"
wrk.headers["User-Agent"] = "bench"
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK {"requests": %d, "seconds": %f, "connect": %d, "read": %d, "write": %d, '
    .. '"status": %d, "timeout": %d, "p50_ms": %f, "p99_ms": %f, "max_ms": %f}\\n',
    summary.requests, summary.duration / 1e6, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50) / 1e3, latency:percentile(99) / 1e3, latency.max / 1e3))
end
"""


@dataclass(frozen=True, kw_only=True)
class Load:
    """One load run's figures, from either generator."""

    answered: int  # complete answers, whatever their status
    non_200: int
    errors: dict[str, int]  # connect/read/write/timeout failures, no answer
    seconds: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    client_cpu_s: float

    @property
    def per_s(self) -> float:
        return self.answered / self.seconds


class Exchange(asyncio.Protocol):
    """One request: write it once connected, collect the answer until the server closes."""

    def __init__(self, done: asyncio.Future[bytes]) -> None:
        self._done = done
        self._chunks: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(REQUEST)

    def data_received(self, data: bytes) -> None:
        self._chunks.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._done.done():
            return
        if exc is not None:
            self._done.set_exception(exc)
        else:
            self._done.set_result(b"".join(self._chunks))


async def python_load(port: int, clients: int, seconds: float) -> dict[str, Any]:
    """``clients`` loops of connect/GET/read/close for ``seconds``: a Load's fields."""
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    errors = {"connect": 0, "read": 0, "timeout": 0}
    answered = non_200 = 0
    cpu_before, started = time.process_time(), time.monotonic()
    deadline = started + seconds

    async def client() -> None:
        nonlocal answered, non_200
        while time.monotonic() < deadline:
            begin = time.perf_counter()
            done: asyncio.Future[bytes] = loop.create_future()
            try:
                transport, _ = await loop.create_connection(partial(Exchange, done), HOST, port)
            except OSError:
                errors["connect"] += 1
                continue
            try:
                async with asyncio.timeout(2.0):
                    answer = await done
            except TimeoutError:
                errors["timeout"] += 1
                transport.abort()
                continue
            except OSError:
                answer = b""
            if not answer.startswith(b"HTTP/1.1 "):
                errors["read"] += 1  # reset, or closed without an answer (e.g. evicted)
                continue
            latencies.append(time.perf_counter() - begin)
            answered += 1
            non_200 += not answer.startswith(b"HTTP/1.1 200 ")

    await asyncio.gather(*(client() for _ in range(clients)))
    ms = [x * 1000 for x in latencies] or [0.0, 0.0]
    return {
        "answered": answered,
        "non_200": non_200,
        "errors": errors,
        "seconds": time.monotonic() - started,
        "p50_ms": statistics.median(ms),
        "p99_ms": statistics.quantiles(ms, n=100)[98],
        "max_ms": max(ms),
        "client_cpu_s": time.process_time() - cpu_before,
    }


async def run_wrk(wrk: str, port: int, clients: int, seconds: float) -> Load:
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
        script.write(WRK_SCRIPT)
        script.flush()
        before = os.times()
        proc = await asyncio.create_subprocess_exec(
            *(wrk, f"-t{min(2, clients)}", f"-c{clients}", f"-d{seconds:g}s", "--timeout", "2s"),
            *("-s", script.name, f"http://{HOST}:{port}/readyz"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), seconds + 30)
        after = os.times()
    text = out.decode()
    line = next((x for x in text.splitlines() if x.startswith("WRK ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed (exit {proc.returncode}):\n{text}")
    f = json.loads(line[4:])
    return Load(
        answered=f.pop("requests"),
        non_200=f.pop("status"),
        errors={k: f.pop(k) for k in ("connect", "read", "write", "timeout")},
        client_cpu_s=sum(after[2:4]) - sum(before[2:4]),  # children's user + system
        **f,
    )


async def run_python_load(port: int, clients: int, seconds: float) -> Load:
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "bench.rigs.http_load", "--port", str(port)),
        *("--clients", str(clients), "--seconds", str(seconds)),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), seconds + 30)
    if proc.returncode != 0:
        raise RuntimeError(f"python load generator failed (exit {proc.returncode})")
    return Load(**json.loads(out))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(python_load(args.port, args.clients, args.seconds))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
