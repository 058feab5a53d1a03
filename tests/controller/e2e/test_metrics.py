"""The controllers' metrics (``capwatch_controller_*``) on their metrics ports, scraped
over HTTP while a leader and a standby follow real agents through transitions and a
failover; ``promtool check metrics`` on what they serve."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

import pytest

from tests.controller.e2e.processes import wait_until
from tests.controller.e2e.support import (
    Cluster,
    Samples,
    free_port,
    sample,
    scrape,
    scrape_text,
)

pytestmark = pytest.mark.slow


def _promtool_problems(text: str) -> str | None:
    """promtool's complaints about ``text`` ("" when clean); None without promtool."""
    tool = shutil.which("promtool")
    if tool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool not found; .ci/run installs it")
        return None
    check = subprocess.run(
        [tool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    return "" if check.returncode == 0 else check.stdout + check.stderr


def _counts(found: Samples, name: str, label: str, values: tuple[str, ...]) -> dict[str, float]:
    return {v: sample(found, name, **{label: v}) or 0.0 for v in values}


def test_metrics_show_transitions_writes_events_and_the_failover(cluster: Cluster) -> None:
    """The leader's metrics count its nodes by status and streams by state, its writes
    (ok) and Events (posted), and the detection latency of each cycle-driven write; the
    hot standby's show the same nodes and streams, no write and no Event, and leader 0.
    After the leader is killed the standby reads leader 1 and one lease transition, and
    counts the write it held back while it did not lead as fenced, then written. Both
    expositions pass promtool."""
    # gpu-a is followed for its agent pod; the controllers run before its agent starts,
    # so they follow it before its failing cycles (7 s in) however slow the machine.
    cluster.fake.add_node("gpu-a")
    cluster.gpu_node("gpu-d")
    leader_port, standby_port = free_port(), free_port()
    leader = cluster.controller("c1", metrics_port=leader_port)
    cluster.wait_leader("c1")
    cluster.controller("c2", metrics_port=standby_port)
    cluster.agent("gpu-a", 1, fail_cycles=(14, 15))
    cluster.wait_cycled("gpu-a")
    cluster.pod("gpu-a", 1)
    cluster.wait_condition("gpu-a", "True", "CapsEnforced")
    cluster.wait_condition("gpu-a", "False", "CapWriteFailed")
    cluster.wait_condition("gpu-a", "True", "CapsEnforced")
    cluster.wait_events("gpu-a", [("Warning", "CapWriteFailed"), ("Normal", "CapsEnforced")])

    # Each is counted once its answer is back: after the fake API server has it.
    found = wait_until(
        lambda: (
            (s := scrape(leader_port))
            and sample(s, "capwatch_controller_condition_writes_total", result="ok") == 4
            and sample(s, "capwatch_controller_events_total", result="posted") == 3
            and s
        ),
        what="the leader to count its writes and Events",
    )
    assert _counts(found, "capwatch_controller_nodes", "status", ("true", "false", "unknown")) == {
        "true": 1,
        "false": 0,
        "unknown": 1,
    }
    states = ("missing", "connecting", "connected", "unreachable")
    assert _counts(found, "capwatch_controller_streams", "state", states) == {
        "missing": 1,
        "connecting": 0,
        "connected": 1,
        "unreachable": 0,
    }
    # (Not "fenced": a write due before the leader first took the Lease counts there.)
    results = ("ok", "failed", "not_found")
    writes = _counts(found, "capwatch_controller_condition_writes_total", "result", results)
    assert writes == {"ok": 4, "failed": 0, "not_found": 0}
    events = _counts(
        found,
        "capwatch_controller_events_total",
        "result",
        ("posted", "failed", "deduplicated", "fenced"),
    )
    assert events == {"posted": 3, "failed": 0, "deduplicated": 0, "fenced": 0}
    assert sample(found, "capwatch_controller_leader", shard="0") == 1
    assert sample(found, "capwatch_controller_lease_transitions_total", shard="0") == 0
    # gpu-a's three writes came from cycles; gpu-d's AgentMissing from no cycle at all.
    assert sample(found, "capwatch_controller_detection_latency_seconds_count") == 3
    assert sample(found, "capwatch_controller_detection_latency_seconds_bucket", le="+Inf") == 3
    info = [k for k in found if k[0] == "capwatch_controller_info"]
    assert len(info) == 1
    assert {"identity": "c1", "shard": "0", "shards": "1"}.items() <= dict(info[0][1]).items()
    leader_text = scrape_text(leader_port)

    hot = wait_until(
        lambda: (
            (s := scrape(standby_port))
            and sample(s, "capwatch_controller_streams", state="connected") == 1
            and s
        ),
        what="the standby following gpu-a",
    )
    assert _counts(hot, "capwatch_controller_nodes", "status", ("true", "unknown")) == {
        "true": 1,
        "unknown": 1,
    }
    assert sample(hot, "capwatch_controller_leader", shard="0") == 0
    assert sample(hot, "capwatch_controller_condition_writes_total", result="ok") == 0
    assert sample(hot, "capwatch_controller_events_total", result="posted") == 0

    leader.signal(signal.SIGKILL)
    cluster.agents["gpu-a"].popen.kill()
    cluster.wait_leader("c2", timeout=15)
    cluster.wait_condition("gpu-a", "Unknown", "AgentUnreachable")
    after = wait_until(
        lambda: (
            (s := scrape(standby_port))
            and sample(s, "capwatch_controller_condition_writes_total", result="ok") == 1
            and sample(s, "capwatch_controller_events_total", result="posted") == 1
            and s
        ),
        what="the new leader to count its write and its Event",
    )
    assert sample(after, "capwatch_controller_leader", shard="0") == 1
    assert sample(after, "capwatch_controller_lease_transitions_total", shard="0") == 1
    assert (sample(after, "capwatch_controller_condition_writes_total", result="fenced") or 0) >= 1
    assert sample(after, "capwatch_controller_streams", state="unreachable") == 1

    problems = [_promtool_problems(text) for text in (leader_text, scrape_text(standby_port))]
    if None in problems:
        pytest.skip("promtool not found (apt-get install --no-install-recommends prometheus)")
    assert problems == ["", ""], problems
