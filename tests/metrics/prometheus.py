"""A real Prometheus server (Debian's package) for tests: scraping targets, and queries.

``scraping`` runs Prometheus on a private TSDB, scraping the given jobs every
second, and stops it after; ``query`` evaluates an instant query over its HTTP API.
"""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.parse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.metrics.support import free_port, http_get, prometheus_tool


def prometheus_binary() -> str:
    return prometheus_tool("prometheus")


def query(api: str, promql: str) -> list[dict[str, Any]]:
    """The instant vector for ``promql``, as the HTTP API returns it."""
    url = f"{api}/api/v1/query?query={urllib.parse.quote(promql)}"
    body = json.loads(http_get(url))
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


@contextmanager
def scraping(tmp_path: Path, jobs: Mapping[str, str]) -> Iterator[str]:
    """Prometheus scraping each job's ``host:port`` every second; yields its API's URL."""
    web_port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n"
        + "".join(
            f"  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']\n"
            for job, target in jobs.items()
        )
    )
    server = subprocess.Popen(
        [
            prometheus_binary(),
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
        yield f"http://127.0.0.1:{web_port}"
        assert server.poll() is None, server.communicate()[1]
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=15)
        finally:
            server.kill()
            if server.stderr is not None:
                server.stderr.close()
