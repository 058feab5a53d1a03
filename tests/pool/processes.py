"""Real ``capwatch pool`` and ``capwatch controller --dry-run`` processes, and a real gRPC
client of the controller's cluster stream."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc

from capwatch.api.gen.capwatch.v1 import cluster_health_pb2 as cpb
from capwatch.api.gen.capwatch.v1 import cluster_health_pb2_grpc as cpb_grpc

ROOT = Path(__file__).resolve().parent.parent.parent
CAPWATCH = [sys.executable, "-m", "capwatch.cli"]
STATUS = {
    cpb.CONDITION_STATUS_TRUE: "True",
    cpb.CONDITION_STATUS_FALSE: "False",
    cpb.CONDITION_STATUS_UNKNOWN: "Unknown",
}

Conditions = dict[str, tuple[str, str]]  # node -> (status, reason)


def wait_for(what: str, ready: Callable[[], bool], timeout: float, step: float = 0.05) -> float:
    """Poll ``ready`` until it holds; the seconds it took. AssertionError after ``timeout``."""
    started = time.monotonic()
    while not ready():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{what}: not within {timeout:g}s")
        time.sleep(step)
    return time.monotonic() - started


@contextmanager
def process(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``capwatch ARGV...`` with its stdout and stderr in ``log`` (.out, .err); killed after."""
    with log.with_suffix(".out").open("wb") as out, log.with_suffix(".err").open("wb") as err:
        child = subprocess.Popen(
            [*CAPWATCH, *argv], stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=ROOT
        )
    try:
        yield child
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)


def pool_argv(*, nodes: int, interval: float, listen: str, targets: Path, faults=()) -> list[str]:
    argv = ["pool", f"--nodes={nodes}", "--gpus=2", f"--interval={interval:g}"]
    argv += [f"--grpc-listen={listen}", f"--targets-out={targets}", "--log-level=warning"]
    return argv + [f"--fault={fault}" for fault in faults]


def controller_argv(targets: Path) -> list[str]:
    return [
        "controller",
        "--dry-run",
        f"--targets={targets}",
        "--grpc-listen=127.0.0.1:0",
        "--metrics-port=0",
        "--probe-port=0",
        "--log-format=json",
    ]


def serving_address(err: Path) -> str | None:
    """The cluster stream's address, once the controller's JSON log says it serves it."""
    for line in err.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("message") == "cluster stream serving":
            return str(record["address"])
    return None


class ClusterClient:
    """GetClusterSnapshot over a real channel: every node's condition now."""

    def __init__(self, address: str) -> None:
        self._channel = grpc.insecure_channel(address)
        self._stub = cpb_grpc.ClusterHealthServiceStub(self._channel)

    def snapshot(self) -> cpb.ClusterSnapshot:
        request = cpb.GetClusterSnapshotRequest()
        return self._stub.GetClusterSnapshot(request, timeout=5).snapshot

    def conditions(self) -> Conditions:
        return {
            n.node_name: (STATUS.get(n.condition.status, "?"), n.condition.reason)
            for n in self.snapshot().nodes
        }

    def close(self) -> None:
        self._channel.close()
