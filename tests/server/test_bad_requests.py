"""Bad requests cost the log one line each at most, throttled, and no traceback.

In process: malformed requests to every kind of method get INVALID_ARGUMENT and
are counted, with a handful of throttled lines and nothing from grpc. Then a
real agent (TLS on TCP, plaintext on its unix socket) takes hundreds of
failed handshakes and malformed requests, and its stderr is counted: before,
grpc core wrote a line per handshake and grpc.aio seven per request.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from capwatch.kit.throttling import THROTTLE_BURST, THROTTLE_REFILL_S
from capwatch.server.metrics.cycle_metrics import Metrics
from tests.metrics.support import running_agent, scrape, value
from tests.server.harness import ServerHarness

GARBAGE = b"\xff\xff\xff\xff"  # a field number of 0 and a truncated varint: never parses
METHODS = {
    "/capwatch.v1.NodeHealthService/Watch": "unary_stream",
    "/capwatch.v1.NodeHealthService/GetSnapshot": "unary_unary",
    "/v1.DRAResourceHealth/NodeWatchResources": "unary_stream",
    "/v1alpha1.DRAResourceHealth/NodeWatchResources": "unary_stream",
    "/grpc.health.v1.Health/Check": "unary_unary",
    "/grpc.health.v1.Health/Watch": "unary_stream",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": "stream_stream",
}


def allowed_lines(elapsed_s: float) -> int:
    """What the throttle may let through in ``elapsed_s``: the burst, plus its refill."""
    return THROTTLE_BURST + 1 + int(elapsed_s / THROTTLE_REFILL_S)


async def call_with_garbage(channel: grpc.aio.Channel, method: str) -> None:
    kind = METHODS[method]
    if kind == "unary_unary":
        await channel.unary_unary(method)(GARBAGE, timeout=10)
    elif kind == "unary_stream":
        await channel.unary_stream(method)(GARBAGE, timeout=10).read()
    else:
        call: Any = channel.stream_stream(method)(timeout=10)
        await call.write(GARBAGE)
        await call.read()


async def send_garbage(channel: grpc.aio.Channel, method: str) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call_with_garbage(channel, method)
    return caught.value


@pytest.mark.asyncio
async def test_malformed_requests_get_invalid_argument_and_a_throttled_line_each(
    harness: ServerHarness, caplog: pytest.LogCaptureFixture
) -> None:
    """300 requests that do not parse, spread over every method kind (unary, server
    streaming, bidirectional): each gets INVALID_ARGUMENT naming the message type, each is
    counted; the log has a burst of one-line warnings, no traceback, nothing from grpc."""
    caplog.set_level(logging.DEBUG)
    methods = list(METHODS)
    started = time.monotonic()
    async with harness.channel() as channel:
        for i in range(300):
            error = await send_garbage(channel, methods[i % len(methods)])
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
            assert str(error.details()).startswith("malformed request: Error parsing message")
        # The same channel still serves good requests.
        good = await channel.unary_unary(
            "/grpc.health.v1.Health/Check", response_deserializer=None
        )(b"", timeout=10)
        assert isinstance(good, bytes)
    elapsed = time.monotonic() - started
    assert all(record.exc_info is None for record in caplog.records)
    assert [
        r for r in caplog.records if r.name.startswith("grpc") and r.levelno > logging.INFO
    ] == []
    lines = [r.getMessage() for r in caplog.records if r.name == "capwatch.server.malformed"]
    assert 1 <= len(lines) <= allowed_lines(elapsed), lines
    assert lines[0].startswith("malformed request refused method=")
    assert "Error parsing message with type" in lines[0]
    assert "\n" not in "".join(lines)
    assert harness.server.malformed_requests() == 300
    found = scrape(
        Metrics(
            publication=harness.publication, malformed_requests=harness.server.malformed_requests
        ).registry
    )
    assert value(found, "capwatch_grpc_malformed_requests_total") == 300
    assert harness.publication.subscribers == 0  # no malformed stream held a slot


def self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "server.pem", directory / "server.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-days", "1", "-subj", "/CN=localhost",
            "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert),
        ],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return cert, key


def failed_handshakes(port: int, count: int) -> None:
    """Plaintext HTTP/1.1 to the TLS port: each connection's handshake fails."""
    for _ in range(count):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            conn.sendall(b"GET / HTTP/1.1\r\nHost: agent\r\n\r\n")
            conn.settimeout(5)
            try:
                while conn.recv(4096):
                    pass
            except (TimeoutError, ConnectionError):
                pass


# Lines an agent writes whatever its clients do: cycles and readiness changes.
ROUTINE = re.compile(r" capwatch\.(agent\.[a-z_.]+|server\.grpc\.(health|serving)|launch): ")


def test_a_real_agent_logs_no_handshake_lines_and_few_for_malformed_requests(
    tmp_path: Path,
) -> None:
    """200 failed TLS handshakes and 200 malformed requests to a real `capwatch agent`
    (GRPC_VERBOSITY unset, as in the pod) add at most the throttle's burst to its stderr,
    and no traceback."""
    cert, key = self_signed(tmp_path)
    sock = tmp_path / "agent.sock"
    args = ["--grpc-listen", f"unix://{sock}", "--grpc-tls-cert", str(cert)]
    with running_agent(
        tmp_path, [*args, "--grpc-tls-key", str(key), "--metrics-port", "0"]
    ) as agent:
        target = agent.wait_for(r"grpc serving addresses=\S*(127\.0\.0\.1:\d+)")[1]
        agent.wait_for(r"cycle seq=2 ")
        before = len(agent.lines)
        started = time.monotonic()
        failed_handshakes(int(target.rsplit(":", 1)[1]), 200)

        async def malformed() -> None:
            async with grpc.aio.insecure_channel(f"unix://{sock}") as channel:
                for _ in range(200):
                    error = await send_garbage(channel, "/capwatch.v1.NodeHealthService/Watch")
                    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT

        asyncio.run(malformed())
        agent.wait_for(r"malformed request refused")
        time.sleep(0.5)  # anything still on its way to stderr
        elapsed = time.monotonic() - started
        added = [line for line in agent.lines[before:] if not ROUTINE.search(line)]
    assert agent.proc.returncode == 0, agent.log
    assert not [line for line in added if "Handshake" in line or "Traceback" in line], added
    assert all(" capwatch.server.malformed: malformed request refused" in line for line in added), (
        added
    )
    assert len(added) <= allowed_lines(elapsed), added
