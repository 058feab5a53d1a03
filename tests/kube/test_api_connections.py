"""The controller's API client keeps a connection for everything it may have in flight
at once (controller.kube.api_client): its 16 request threads and the discovery's two
watches. Three rounds of 18 requests held open together by the server reuse the same
18 connections; with fewer kept, each round would drop some and dial (with TLS: a
handshake) again, and urllib3 would warn that its pool is full."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from capwatch.controller.kube import DISCOVERY_WATCHES, KUBE_THREADS, api_client

IN_FLIGHT = KUBE_THREADS + DISCOVERY_WATCHES
ROUNDS = 3
BARRIER_S = 30.0  # a bound for a hang, never a speed claim


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.connections = 0
        self.lock = threading.Lock()
        self.together = threading.Barrier(IN_FLIGHT, timeout=BARRIER_S)

    def get_request(self):  # type: ignore[no-untyped-def]
        accepted = super().get_request()
        with self.lock:
            self.connections += 1
        return accepted


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the API server
    server: _Server

    def do_GET(self) -> None:
        self.server.together.wait()  # every request of the round in flight at once
        body = json.dumps({"kind": "Node"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[_Server]:
    started = _Server()
    thread = threading.Thread(target=started.serve_forever, daemon=True)
    thread.start()
    try:
        yield started
    finally:
        started.shutdown()
        started.server_close()


def test_every_request_in_flight_keeps_its_connection(
    server: _Server, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """18 requests at once, three times: 18 connections in all, and no pool-full warning."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}
                ],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    transport = api_client(str(kubeconfig), identity="r0")
    failures: list[BaseException] = []

    def one() -> None:
        try:
            response = transport.request("GET", "/api/v1/nodes/n", timeout=BARRIER_S)
            assert response.status == 200
            _ = response.data
            response.release_conn()
        except Exception as err:  # noqa: BLE001 - reported by the test, not lost in a thread
            failures.append(err)

    with caplog.at_level(logging.WARNING, logger="urllib3"):
        for _ in range(ROUNDS):
            threads = [threading.Thread(target=one) for _ in range(IN_FLIGHT)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(BARRIER_S * 2)
    transport.close()
    assert failures == []
    assert server.connections == IN_FLIGHT
    assert "Connection pool is full" not in caplog.text
