"""`promtool check metrics` on what a running agent serves (Debian's prometheus package)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.metrics.support import (
    free_port,
    http_get,
    listening_tcp_ports,
    prometheus_tool,
    running_agent,
    samples,
    value,
)


def promtool() -> str:
    return prometheus_tool("promtool")


def test_a_running_agents_metrics_pass_promtool(tmp_path: Path):
    """The exposition of a live agent, after cycles of every kind it runs, lints clean."""
    tool = promtool()
    port = free_port()
    with running_agent(
        tmp_path, ["--metrics-port", str(port), "--metrics-address", "127.0.0.1"]
    ) as agent:
        agent.wait_for(rf"metrics serving address=127\.0\.0\.1:{port} ")
        url = f"http://127.0.0.1:{port}/metrics"
        # The built-in scenario fails a write in cycles 4-6: wait for a failure and a recovery.
        deadline = time.monotonic() + 15
        while True:
            found = samples(http_get(url))
            failed = value(found, "capwatch_cycles_total", result="failed")
            if failed >= 1 and value(found, "capwatch_ready") == 1.0:
                break
            assert time.monotonic() < deadline, agent.log
            time.sleep(0.1)
        text = http_get(url)
        grpc_port = int(agent.grpc_target.rsplit(":", 1)[1])
        assert listening_tcp_ports(agent.proc.pid) == {grpc_port, port}
    check = subprocess.run(
        [tool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert (check.returncode, check.stdout + check.stderr) == (0, ""), text
    assert (
        value(samples(text), "capwatch_apply_failures_total", gpu="0", reason="write_failed") >= 1
    )


def test_promtool_rejects_a_badly_named_counter():
    """The check has teeth: a counter without _total is reported, so a clean run means something."""
    tool = promtool()
    bad = "# HELP capwatch_cycles Cycles.\n# TYPE capwatch_cycles counter\ncapwatch_cycles 1\n"
    check = subprocess.run(
        [tool, "check", "metrics"], input=bad, capture_output=True, text=True, check=False
    )
    assert check.returncode != 0
    assert "_total" in check.stdout + check.stderr
