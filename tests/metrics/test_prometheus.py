"""A real Prometheus server (Debian's package) scrapes a running agent every second."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from tests.metrics.support import free_port, http_get, running_agent

SCRAPE_WAIT_S = 30.0


def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        message = "prometheus not found (apt-get install --no-install-recommends prometheus)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; .ci/run installs it")
        pytest.skip(message)
    return found


def query(api: str, promql: str) -> list[dict[str, Any]]:
    """The instant vector for ``promql``, as the HTTP API returns it."""
    url = f"{api}/api/v1/query?query={urllib.parse.quote(promql)}"
    body = json.loads(http_get(url))
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def by_label(result: list[dict[str, Any]], label: str) -> dict[str, float]:
    return {series["metric"][label]: float(series["value"][1]) for series in result}


@pytest.mark.slow
def test_prometheus_scrapes_the_agent(tmp_path: Path):
    """Prometheus finds every cycle-result series, a ready agent and its GPUs' caps."""
    binary = prometheus_binary()
    metrics_port, web_port = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n"
        "  scrape_interval: 1s\n"
        "  scrape_timeout: 1s\n"
        "scrape_configs:\n"
        "  - job_name: capwatch\n"
        "    static_configs:\n"
        f"      - targets: ['127.0.0.1:{metrics_port}']\n"
    )
    api = f"http://127.0.0.1:{web_port}"
    args = ["--metrics-port", str(metrics_port), "--metrics-address", "127.0.0.1"]
    with running_agent(tmp_path, args) as agent:
        agent.wait_for(rf"metrics serving address=127\.0\.0\.1:{metrics_port} ")
        server = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{web_port}",
                "--log.level=warn",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + SCRAPE_WAIT_S
            while True:
                assert server.poll() is None, server.communicate()[1]
                try:
                    cycles = by_label(query(api, "capwatch_cycles_total"), "result")
                    ready = query(api, 'capwatch_ready{job="capwatch"}')
                except OSError:  # not listening yet
                    cycles, ready = {}, []
                if cycles.get("enforced", 0) > 0 and ready and ready[0]["value"][1] == "1":
                    break
                assert time.monotonic() < deadline, f"no scrape in {SCRAPE_WAIT_S}s: {cycles}"
                time.sleep(0.25)
            assert set(cycles) == {"enforced", "failed", "aborted"}
            assert cycles["aborted"] == 0
            up = query(api, 'up{job="capwatch"}')
            assert [s["value"][1] for s in up] == ["1"]
            applied = by_label(query(api, "capwatch_gpu_applied_cap_watts"), "gpu")
            assert set(applied) == {str(i) for i in range(6)}  # the built-in scenario's GPUs
            info = query(api, "capwatch_info")
            assert [s["metric"]["node"] for s in info] == ["sim-node-0"]
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=15)
            finally:
                server.kill()
                if server.stderr is not None:
                    server.stderr.close()
    assert agent.proc.returncode == 0, agent.log
