"""No uncapped window across restarts and upgrades, on the real node.

A GPU capped for a running workload is watched through the fake NVML's limits
file (where the device's limit lives between agent processes, as it does on a
real GPU) every 20 ms while the chart's agent is restarted by `kubectl rollout
restart`, then replaced by `helm upgrade` to a new image: the limit never reads
the default. `helm uninstall` then restores it, because the departing agent
finds its DaemonSet gone (docs/upgrades.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.fakenvml.values import DEFAULT_LIMIT_MW, read_limits_file
from tests.realnode.cluster import Cluster, ready, wait_for
from tests.realnode.containerd import FAKENVML_DIR

NAMESPACE = "upgrades"
RELEASE = "keep"
WORKLOAD_NS = "jobs"
WATTS = 250
# The fake NVML's first device, as its `devices` directive names it.
GPU0 = "GPU-fa4e0000-0000-4000-8000-000000000000"
SAMPLE_S = 0.02


@dataclass
class Samples:
    """GPU 0's limit as the limits file says, read every SAMPLE_S."""

    path: Path
    values: list[tuple[float, int]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.wait(SAMPLE_S):
            limits = read_limits_file(self.path)
            self.values.append((time.monotonic(), limits.get(GPU0, DEFAULT_LIMIT_MW)))

    def since(self, start: float) -> list[int]:
        return [value for at, value in self.values if at >= start]


@contextmanager
def sampling(path: Path) -> Iterator[Samples]:
    samples = Samples(path)
    thread = threading.Thread(target=samples.run, name="limit-sampler", daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        samples.stop.set()
        thread.join(5)


def replaced(realnode: Cluster, old_uid: str, what: str) -> dict[str, Any]:
    """The release's next agent pod: another uid, Ready, its predecessor gone."""

    def check() -> dict[str, Any] | None:
        pods = realnode.pods(NAMESPACE, f"app.kubernetes.io/instance={RELEASE}")
        if any(p["metadata"]["uid"] == old_uid for p in pods) or len(pods) != 1:
            return None
        pod = pods[0]
        return pod if ready(pod) == "True" else None

    return wait_for(check, 180.0, what)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_rollout_and_upgrade_keep_the_cap_and_uninstall_restores_it(realnode: Cluster) -> None:
    """GPU 0 capped at 250 W by the chart's NVML agent stays at 250 W at every 20 ms
    sample through a rollout restart and a helm upgrade to a new image tag (no restore
    write in the fake's log either); helm uninstall brings it back to the default."""
    holder = realnode.run_workload(WORKLOAD_NS, "holder", watts=WATTS)
    limits = realnode.node.fakenvml_dir / "upgrade-limits"
    log = "upgrade-writes.log"
    realnode.write_fakenvml(
        [
            "devices 2",
            f"processes 0 {realnode.container_pid(holder, 'main')}",
            f"log_file {FAKENVML_DIR}/{log}",
            f"limits_file {FAKENVML_DIR}/upgrade-limits",
        ]
    )
    realnode.install(RELEASE, NAMESPACE, "--set", "agent.gpuBackend=nvml")
    try:
        first = wait_for(
            lambda: (p := realnode.agent_pod(NAMESPACE, RELEASE)) and ready(p) == "True" and p,
            150.0,
            "the agent Ready",
        )
        wait_for(lambda: read_limits_file(limits).get(GPU0) == WATTS * 1000, 60.0, "GPU 0 capped")
        with sampling(limits) as samples:
            start = time.monotonic()
            realnode.rollout_restart(NAMESPACE, f"{RELEASE}-capwatch")
            second = replaced(realnode, first["metadata"]["uid"], "the restarted agent Ready")

            new_image = realnode.tag_image("0.1.1-test")
            done = realnode.upgrade(
                RELEASE, NAMESPACE, "--set", "agent.gpuBackend=nvml",
                "--set", "image.tag=0.1.1-test", "--wait", "--timeout", "180s",
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            third = replaced(realnode, second["metadata"]["uid"], "the upgraded agent Ready")
            assert third["spec"]["containers"][0]["image"] == new_image
            time.sleep(1.0)  # a few samples of the upgraded agent's own
        seen = samples.since(start)
        span = samples.values[-1][0] - start if samples.values else 0.0
        print(f"GPU 0's limit sampled {len(seen)} times over {span:.1f}s: {sorted(set(seen))} mW")
        assert len(seen) > 200  # the whole window, sampled densely
        assert set(seen) == {WATTS * 1000}, f"GPU 0's limit left 250 W: {sorted(set(seen))}"
        writes = [e for e in realnode.fakenvml_writes(log) if e.get("device") == "0"]
        assert {e["milliwatts"] for e in writes} == {str(WATTS * 1000)}
    finally:
        realnode.uninstall(RELEASE, NAMESPACE)
    # The last agent found its DaemonSet gone (or its access revoked) and restored.
    wait_for(
        lambda: read_limits_file(limits).get(GPU0) == DEFAULT_LIMIT_MW,
        30.0,
        "GPU 0 back at its default after uninstall",
    )
    writes = [e for e in realnode.fakenvml_writes(log) if e.get("device") == "0"]
    assert writes[-1]["milliwatts"] == str(DEFAULT_LIMIT_MW)
