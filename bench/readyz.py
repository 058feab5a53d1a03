"""``GET /readyz`` under load: the real ``capwatch shim`` against a minimal HTTP handler.

The shim runs as the agent's pod runs it: a ``capwatch shim`` process of its
own, following a real capwatch.v1 stream (tests/server/harness.py's gRPC
server in this process, a cycle published every 0.5 s, stale after 1.5 s), so
it is in its steady state and every 200 it gives is earned. The load
generator is a process of its own too: ``wrk`` where installed (Debian:
``apt-get install wrk``), else a Python asyncio generator in a child process.
Either way each of the concurrent clients does connect, GET (with
``Connection: close``, as the kubelet's prober sends), read the answer, close,
in a loop: a connection per request, as probes arrive.

The baseline, measured in the same run with the same generator, is the least
an HTTP server can do on the same stack: an ``asyncio.start_server`` handler
(its own process, stdlib only) that reads the request head and writes a fixed
200 of the same size with ``Connection: close``. Same event loop, same stream
classes, same connection-per-request pattern, so the ratio is the cost of the
shim's own work (parsing, deadlines, eviction bookkeeping, the readiness
rule) and not of a different architecture; ``http.server`` would be a thread
per connection, slower, and flatter the ratio.

Printed, all measured in this run, shim and baseline alternated for 2 rounds
of 5 s (each after a 1 s warm-up), the best round of each by requests/s (a
2-core machine shared with other work is noisy; requests without a 200 count
from every round):
* answered requests/s, latency p50/p99/max, requests without an answer, CPU;
  the ratio shim/baseline requests/s (target >= 0.5, with every request a 200:
  its stream consumer shares the event loop with the load, so a starved one
  shows as 503s);
* the shim's resident memory (VmRSS): ready, after the first warm-up, after
  the load (target <= 60 MiB).

wrk's latency runs from writing the request to the end of the answer (the
connect is not in it); the Python generator's from the connect. On 2 cores
the Python generator saturates before either server does, so its ratio is
near 1 whatever the shim costs: prefer wrk.

``--json FILE`` writes every round's figures for bench/plot.py too.

Run: ``make bench`` (or ``PYTHONPATH=. .venv/bin/python bench/readyz.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from bench.figures import check_writable, write_json
from bench.readyz_figures import Figures, Load, Measured, json_figures, report

HOST = "127.0.0.1"
INTERVAL_S = 0.5  # between published cycles; the harness makes them stale after 1.5 s
REQUEST = b"GET /readyz HTTP/1.1\r\nHost: bench\r\nUser-Agent: bench\r\nConnection: close\r\n\r\n"
# The shim's 200, byte for byte in size: "ok: last good cycle 0.3s ago\n".
BODY = b"ok: last good cycle 0.3s ago\n"
BASELINE_RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: %d\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n%s"
    % (len(BODY), BODY)
)
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


async def _baseline_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(BASELINE_RESPONSE)
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def serve_baseline() -> None:
    """Serve the fixed 200 on an ephemeral port (printed first) until SIGTERM."""
    server = await asyncio.start_server(_baseline_handler, HOST, 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    server.close()
    await server.wait_closed()


class _Exchange(asyncio.Protocol):
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
                transport, _ = await loop.create_connection(partial(_Exchange, done), HOST, port)
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
        *(sys.executable, __file__, "--role", "load", "--port", str(port)),
        *("--clients", str(clients), "--seconds", str(seconds)),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), seconds + 30)
    if proc.returncode != 0:
        raise RuntimeError(f"python load generator failed (exit {proc.returncode})")
    return Load(**json.loads(out))


def proc_status_kib(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def cpu_s(pid: int) -> float:
    # utime and stime, fields 14 and 15; the command name (field 2) may hold spaces.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    # The shim refuses port 0; a just-freed ephemeral port is the next best thing.
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


async def get_readyz(port: int) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(REQUEST)
        async with asyncio.timeout(2.0):
            data = await reader.read()
    finally:
        writer.close()
    return int(data.split(b" ", 2)[1]), data.split(b"\r\n\r\n", 1)[1]


async def wait_ready(port: int, timeout_s: float) -> None:
    deadline, last = time.monotonic() + timeout_s, "nothing"
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, TimeoutError, IndexError, ValueError):
            status, body = await get_readyz(port)
            if status == 200:
                return
            last = f"{status} {body!r}"
        await asyncio.sleep(0.1)
    raise RuntimeError(f"/readyz on port {port} not 200 within {timeout_s:g}s, last: {last}")


async def stop_child(proc: asyncio.subprocess.Process) -> int | None:
    """SIGTERM, then SIGKILL after 5 s; the exit status."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    return proc.returncode


async def measure(
    pid: int, port: int, args: argparse.Namespace, wrk: str | None
) -> tuple[Measured, int]:
    """Warm up, then the measured load; with the server's RSS after the warm-up (KiB)."""

    async def run(seconds: float) -> Load:
        if wrk is not None:
            return await run_wrk(wrk, port, args.clients, seconds)
        return await run_python_load(port, args.clients, seconds)

    await run(args.warmup)
    warm_kib = proc_status_kib(pid)
    before = cpu_s(pid)
    load = await run(args.seconds)
    return Measured(load=load, server_cpu_s=cpu_s(pid) - before), warm_kib


async def measure_all(args: argparse.Namespace, wrk: str | None, shim_log: Any) -> Figures:
    """Agent stream, shim and baseline up; both measured; everything stopped again."""
    from tests.server.harness import start_harness

    harness = await start_harness(interval_s=INTERVAL_S)
    stop_publishing = asyncio.Event()

    async def publish() -> None:
        while not stop_publishing.is_set():
            harness.publish()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop_publishing.wait(), INTERVAL_S)

    publisher = asyncio.create_task(publish())
    port = free_port()
    shim = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "capwatch.cli", "shim", "--target", harness.target),
        *("--readyz-address", HOST, "--readyz-port", str(port)),
        env={k: v for k, v in os.environ.items() if not k.startswith("CAPWATCH_")},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=shim_log,
    )
    baseline = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--role", "baseline", stdout=asyncio.subprocess.PIPE
    )
    try:
        assert baseline.stdout is not None
        baseline_port = int(await asyncio.wait_for(baseline.stdout.readline(), 10))
        await wait_ready(port, 20)
        await asyncio.sleep(1.0)  # a couple of cycles and heartbeats in steady state
        ready_kib = proc_status_kib(shim.pid)
        bares: list[Measured] = []
        shims: list[Measured] = []
        warm_kib = 0
        for _ in range(args.rounds):  # alternated, so a neighbour's burst hits both alike
            bares.append((await measure(baseline.pid, baseline_port, args, wrk))[0])
            ours, warm = await measure(shim.pid, port, args, wrk)
            shims.append(ours)
            warm_kib = warm_kib or warm
        after_kib = proc_status_kib(shim.pid)
        peak_kib = proc_status_kib(shim.pid, "VmHWM")
        status, body = await get_readyz(port)
    finally:
        stop_publishing.set()
        await publisher
        shim_exit = await stop_child(shim)
        await stop_child(baseline)
        await harness.server.stop()
    return Figures(
        shim=max(shims, key=lambda m: m.load.per_s),
        bare=max(bares, key=lambda m: m.load.per_s),
        shim_failed=sum(m.failed for m in shims),
        rounds=tuple(zip(shims, bares, strict=True)),
        ready_kib=ready_kib,
        warm_kib=warm_kib,
        after_kib=after_kib,
        peak_kib=peak_kib,
        final=f"{status} {body.decode().strip()}",
        shim_exit=shim_exit,
    )


async def bench(args: argparse.Namespace) -> int:
    wrk = shutil.which("wrk") if args.load_gen in ("auto", "wrk") else None
    if args.load_gen == "wrk" and wrk is None:
        raise SystemExit("wrk not found (Debian: apt-get install wrk)")
    if wrk is not None:
        generator = f"wrk ({wrk}), 2 threads"
    else:
        missing = " (wrk not installed)" if args.load_gen == "auto" else ""
        generator = f"Python asyncio generator in one child process{missing}"
    print(
        f"capwatch /readyz benchmark: {args.clients} concurrent clients, a connection per "
        f"request, {args.seconds:g} s after {args.warmup:g} s warm-up each, Python "
        f"{sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.2f} at start\n  load generator: {generator}"
    )
    started = time.monotonic()
    with tempfile.TemporaryFile() as shim_log:
        try:
            figures = await measure_all(args, wrk, shim_log)
        finally:
            shim_log.seek(0)
            log = shim_log.read().decode(errors="replace")
            if sys.exc_info()[0] is not None:
                print(f"  shim's log:\n{log}", file=sys.stderr)
    report(figures, args)
    print(
        f"  ({time.monotonic() - started:.0f} s in all; load average "
        f"{os.getloadavg()[0]:.2f} at the end; shim exit status {figures.shim_exit})"
    )
    if figures.shim_exit != 0 or "Traceback" in log:
        print(f"  shim's log:\n{log}", file=sys.stderr)
        return 1
    if args.json is not None:
        write_json(args.json, json_figures(figures, args, generator))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=5.0, help="measured load, each server")
    parser.add_argument("--warmup", type=float, default=1.0, help="load before measuring")
    parser.add_argument("--rounds", type=int, default=2, help="alternated, best reported")
    parser.add_argument("--load-gen", choices=("auto", "wrk", "python"), default="auto")
    # Internal: the children this bench spawns.
    parser.add_argument("--role", choices=("bench", "baseline", "load"), default="bench")
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="also write the figures here (bench/plot.py)")
    args = parser.parse_args()
    check_writable(args.json)
    if args.role == "baseline":
        asyncio.run(serve_baseline())
        return 0
    if args.role == "load":
        print(json.dumps(asyncio.run(python_load(args.port, args.clients, args.seconds))))
        return 0
    return asyncio.run(bench(args))


if __name__ == "__main__":
    sys.exit(main())
