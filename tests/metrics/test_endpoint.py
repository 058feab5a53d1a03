"""The metrics endpoint: flags, serving, `--metrics-port 0`, a port in use at start, and
clients that would hold threads, probe other paths or flood it with scrapes."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import socket
import threading
import urllib.error
from collections.abc import Iterable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from capwatch.cli import main
from capwatch.server.metrics.cycle_metrics import Metrics
from capwatch.server.metrics.endpoint import MetricsServer
from capwatch.server.settings import server_settings
from tests.metrics.support import (
    eventually,
    http_get,
    listening_tcp_ports,
    running_agent,
    samples,
    value,
)
from tests.server.harness import ServerHarness, start_harness


def settings(**flags: str | None) -> tuple[int | None, str]:
    parsed = server_settings(argparse.Namespace(grpc_listen=["127.0.0.1:0"], **flags), {})
    return parsed.metrics_port, parsed.metrics_address


def test_metrics_flags_default_to_9400_on_every_interface():
    """Defaults: port 9400 on 0.0.0.0; 0 means off; brackets around IPv6 are accepted."""
    assert settings() == (9400, "0.0.0.0")
    assert settings(metrics_port="0") == (None, "0.0.0.0")
    assert settings(metrics_port="19400", metrics_address="127.0.0.1") == (19400, "127.0.0.1")
    assert settings(metrics_address="[::1]") == (9400, "::1")
    assert settings(metrics_address="localhost") == (9400, "localhost")


def test_metrics_port_twin_is_read_and_the_flag_wins():
    """CAPWATCH_METRICS_PORT applies without the flag; the flag overrides it."""
    ns = argparse.Namespace(grpc_listen=["127.0.0.1:0"])
    assert server_settings(ns, {"CAPWATCH_METRICS_PORT": "0"}).metrics_port is None
    ns.metrics_port = "9500"
    assert server_settings(ns, {"CAPWATCH_METRICS_PORT": "0"}).metrics_port == 9500


@pytest.mark.usefixtures("restore_logging")
@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (["--metrics-port", "http"], {}, "--metrics-port: must be a port from 0"),
        (["--metrics-port", "65536"], {}, "--metrics-port: must be a port from 0"),
        (["--metrics-port", "-1"], {}, "--metrics-port: must be a port from 0"),
        ([], {"CAPWATCH_METRICS_PORT": "x"}, "--metrics-port (from $CAPWATCH_METRICS_PORT)"),
        (["--metrics-address", "not an address"], {}, "--metrics-address: expected an IP"),
        (["--metrics-address", ""], {}, "--metrics-address: expected an IP"),
    ],
)
def test_invalid_metrics_flags_exit_2_with_one_line(
    argv: list[str], env: dict[str, str], expected: str, capsys, tmp_path: Path
):
    """A bad metrics port or address is a configuration error naming the flag."""
    code = main(["agent", "--gpu-backend", "sim", "--state-dir", str(tmp_path), *argv], env)
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert expected in err


@pytest.mark.asyncio
async def test_endpoint_serves_the_registry_quietly_and_frees_its_port(capfd):
    """/metrics answers with the text format and logs no access line; stop frees the port."""
    harness: ServerHarness = await start_harness()
    try:
        metrics = Metrics(publication=harness.publication)
        server = MetricsServer(metrics=metrics, address="127.0.0.1", port=0)
        await server.start()
        url = f"http://127.0.0.1:{server.port}/metrics"
        harness.publish()
        await eventually(lambda: metrics.folded_sequence == 1)
        for _ in range(3):
            text = await asyncio.to_thread(http_get, url)
        assert server.address == f"127.0.0.1:{server.port}"
        assert "# TYPE capwatch_cycles_total counter" in text
        assert value(samples(text), "capwatch_cycles_total", result="enforced") == 1.0
        openmetrics = await asyncio.to_thread(
            http_get, url, accept="application/openmetrics-text; version=1.0.0"
        )
        assert openmetrics.endswith("# EOF\n")
        await server.stop()
    finally:
        await harness.server.stop()
    captured = capfd.readouterr()
    assert "GET /metrics" not in captured.out + captured.err  # no per-request access log
    with pytest.raises(urllib.error.URLError):
        http_get(url, timeout=1)


def test_metrics_port_0_serves_nothing_while_agent_and_grpc_run(tmp_path: Path):
    """With CAPWATCH_METRICS_PORT=0 the agent listens on its gRPC port alone, and works:
    its grpc health reaches SERVING."""
    with running_agent(tmp_path, env={"CAPWATCH_METRICS_PORT": "0"}) as agent:
        target = agent.grpc_target
        agent.wait_for(r"cycle seq=3 ")
        assert listening_tcp_ports(agent.proc.pid) == {int(target.rsplit(":", 1)[1])}
        with grpc.insecure_channel(target) as channel:
            # Wait for SERVING rather than asking once: the built-in scenario fails
            # cycles 4-6, and at a 0.2 s interval one Check after cycle 3 raced them
            # (and the 0.6 s staleness bound) on a loaded machine.
            statuses = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service=""), timeout=30
            )
            serving = any(r.status == health_pb2.HealthCheckResponse.SERVING for r in statuses)
            statuses.cancel()
        assert serving
        assert "metrics serving" not in agent.log
    assert agent.proc.returncode == 0, agent.log


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """main() points the root logger at this test's stderr; put it back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("restore_logging")
def test_metrics_port_in_use_is_fatal_at_start(tmp_path: Path, capsys):
    """A metrics port that cannot be bound stops the start: exit 1, one line naming the
    flag, nothing left."""
    state = tmp_path / "state"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(
            [
                "agent",
                "--gpu-backend",
                "sim",
                "--state-dir",
                str(state),
                "--grpc-listen",
                f"unix://{tmp_path}/agent.sock",
                "--metrics-address",
                "127.0.0.1",
                "--metrics-port",
                str(port),
            ],
            {},
        )
    assert code == 1
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == (
        f"capwatch agent: cannot start: --metrics-port: cannot serve metrics on "
        f"127.0.0.1:{port}: address already in use"
    )
    assert not (tmp_path / "agent.sock").exists()  # the gRPC server bound it, then let go
    record = state / "ownership.json"
    assert not record.exists() or json.loads(record.read_text())["gpus"] == {}  # no cycle ran


async def http(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """One request on its own connection: status, headers (lower-cased), body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    async with asyncio.timeout(5):
        data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split(" ")[1]), headers, body


def request_for(path: str, method: str = "GET") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: agent\r\n\r\n".encode()


@pytest.mark.asyncio
async def test_only_get_and_head_on_metrics_are_answered():
    """GET /metrics (a query is ignored) and HEAD get the registry (HEAD without a body but
    with its length); any other path is 404, any other method 405."""
    harness: ServerHarness = await start_harness()
    server = MetricsServer(
        metrics=Metrics(publication=harness.publication), address="127.0.0.1", port=0
    )
    await server.start()
    try:
        status, headers, body = await http(server.port, request_for("/metrics"))
        assert status == 200
        assert headers["content-type"].startswith("text/plain; version=0.0.4")
        assert b"# TYPE capwatch_cycles_total counter" in body
        assert (await http(server.port, request_for("/metrics?name[]=capwatch_ready")))[0] == 200
        status, headers, body = await http(server.port, request_for("/metrics", "HEAD"))
        assert (status, body) == (200, b"")
        assert int(headers["content-length"]) > 1000
        for path in ("/", "/favicon.ico", "/metrics/", "/readyz", "/metricsx"):
            assert (await http(server.port, request_for(path)))[0] == 404, path
        for method in ("POST", "PUT", "DELETE"):
            status, headers, _ = await http(server.port, request_for("/metrics", method))
            assert (status, headers["allow"]) == (405, "GET, HEAD"), method
    finally:
        await server.stop()
        await harness.server.stop()


@pytest.mark.asyncio
async def test_idle_connections_cost_no_thread_are_capped_and_time_out():
    """200 connections that never send a request start no thread; past the cap the oldest
    silent ones are dropped, so a scrape is still answered; the rest are closed at the
    request deadline, leaving nothing open."""
    harness: ServerHarness = await start_harness()
    server = MetricsServer(
        metrics=Metrics(publication=harness.publication),
        address="127.0.0.1",
        port=0,
        max_connections=32,
        head_timeout_s=3.0,
    )
    await server.start()
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        threads = threading.active_count()
        for _ in range(200):
            idle.append(await asyncio.open_connection("127.0.0.1", server.port))
        await eventually(lambda: server.http.connections == 32)
        assert threading.active_count() <= threads  # was a thread per connection
        assert (await http(server.port, request_for("/metrics")))[0] == 200
        async with asyncio.timeout(15):  # the deadline closes whatever was not evicted
            for reader, _ in idle:
                assert await reader.read() == b""
        await eventually(lambda: server.http.connections == 0)
    finally:
        for _, writer in idle:
            writer.close()
        await server.stop()
        await harness.server.stop()


class BlockingCollector(Collector):
    """A collector that holds every render until released, and counts renders."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.renders = 0

    def collect(self) -> Iterable[Metric]:
        self.renders += 1
        self.release.wait(timeout=10)
        return []


@pytest.mark.asyncio
async def test_scrapes_render_off_the_loop_and_share_one_render():
    """While a render is held up in its worker thread, the event loop goes on (a readiness
    probe is served), and 20 scrapes arriving meanwhile all get that one render."""
    harness: ServerHarness = await start_harness()
    metrics = Metrics(publication=harness.publication)
    blocking = BlockingCollector()
    metrics.registry.register(blocking)
    server = MetricsServer(metrics=metrics, address="127.0.0.1", port=0)
    await server.start()
    try:
        scrapes = [
            asyncio.create_task(http(server.port, request_for("/metrics"))) for _ in range(20)
        ]
        # Every scrape has sent its request and waits for its answer; the render has begun.
        await eventually(
            lambda: (server.http.connections, server.http.reading, blocking.renders) == (20, 0, 1),
            timeout=10,
        )
        assert (await http(server.port, request_for("/nowhere")))[0] == 404  # the loop is free
        blocking.release.set()
        answers = await asyncio.gather(*scrapes)
        assert {status for status, _, _ in answers} == {200}
        assert len({body for _, _, body in answers}) == 1
        assert blocking.renders == 1
    finally:
        blocking.release.set()
        await server.stop()
        await harness.server.stop()
