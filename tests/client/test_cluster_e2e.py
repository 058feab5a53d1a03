"""``capwatch watch --cluster`` against a real ``capwatch controller --dry-run`` that
follows real agents on simulated GPUs: every process the real command line."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.metrics.support import AgentProcess, free_port, running_agent

ROOT = Path(__file__).resolve().parents[2]
CAPWATCH = [sys.executable, "-m", "capwatch.cli"]
SCENARIO = ROOT / "agent" / "sim" / "scenarios" / "default.yaml"
DEFAULT_FAULT = "cycles: {from: 4, to: 6}}"
DEVICE_FAULTS = "\ndevice_faults:\n"  # the file's last section


def scenario(tmp_path: Path, name: str, *, fault: tuple[int, int]) -> Path:
    """The built-in scenario with GPU 0's write refused in cycles ``fault`` (the default's
    4-6 would be over before a controller started after the agent sees it), and without
    its device faults (GPU 4's loss would fail gpu-b, which must stay True)."""
    text, found, _ = SCENARIO.read_text().partition(DEVICE_FAULTS)
    assert found
    assert DEFAULT_FAULT in text
    path = tmp_path / f"{name}.yaml"
    path.write_text(text.replace(DEFAULT_FAULT, f"cycles: {{from: {fault[0]}, to: {fault[1]}}}}}"))
    return path


def agent_args(tmp_path: Path, node: str, fault: tuple[int, int]) -> list[str]:
    return [
        "--node-name",
        node,
        "--scenario",
        str(scenario(tmp_path, node, fault=fault)),
        "--interval",
        "0.3",
        "--metrics-port",
        "0",
        "--state-dir",
        str(tmp_path / f"state-{node}"),
    ]


def clean_env() -> dict[str, str]:
    """This environment without capwatch's, grpc's or the terminal width's settings."""
    return {
        k: v for k, v in os.environ.items() if not k.startswith(("CAPWATCH_", "GRPC_", "COLUMNS"))
    }


@contextmanager
def running_controller(targets: Path) -> Iterator[AgentProcess]:
    """``capwatch controller --dry-run --targets FILE`` on 127.0.0.1:0, SIGTERM after."""
    environ = clean_env()
    argv = ["controller", "--dry-run", "--targets", str(targets), "--log-level", "info"]
    argv += ["--grpc-listen", "127.0.0.1:0", "--metrics-port", "0", "--probe-port", "0"]
    proc = subprocess.Popen(
        [*CAPWATCH, *argv],
        env=environ,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    controller = AgentProcess(proc)
    assert proc.stderr is not None
    stderr = proc.stderr
    reader = threading.Thread(target=lambda: controller.lines.extend(stderr), daemon=True)
    reader.start()
    try:
        yield controller
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        finally:
            proc.kill()
            reader.join(timeout=5)
            stderr.close()


async def read_until(stream: asyncio.StreamReader, seen: list[str], pattern: str) -> None:
    """Lines into ``seen`` until one matches ``pattern``."""
    regex = re.compile(pattern)
    while True:
        line = (await stream.readline()).decode()
        if not line:
            raise AssertionError("watch ended early:\n" + "".join(seen))
        seen.append(line)
        if regex.search(line):
            return


def rows_of(lines: Sequence[str], node: str) -> list[list[str]]:
    return [line.split()[:3] for line in lines if line.split()[:1] == [node]]


@pytest.mark.asyncio
@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_a_real_controller_following_real_agents(tmp_path: Path):
    """Two agents (gpu-a's GPU 0 fails three cycles, then recovers) and a node whose agent
    is not there: the cluster watch shows gpu-a turn False CapWriteFailed, then True
    again, gpu-b True throughout, gpu-c Unknown AgentUnreachable; SIGTERM exits 0."""
    with (
        running_agent(tmp_path, agent_args(tmp_path, "gpu-a", (30, 32))) as agent_a,
        running_agent(tmp_path, agent_args(tmp_path, "gpu-b", (90000, 90001))) as agent_b,
    ):
        targets = tmp_path / "targets"
        targets.write_text(
            f"gpu-a {agent_a.grpc_target}\n"
            f"gpu-b {agent_b.grpc_target}\n"
            f"gpu-c 127.0.0.1:{free_port()}  # no agent\n"
        )
        with running_controller(targets) as controller:
            address = controller.wait_for(r"cluster stream serving address=(\S+)")[1]
            watching = await asyncio.create_subprocess_exec(
                *CAPWATCH,
                "watch",
                "--cluster",
                "--target",
                address,
                cwd=ROOT,
                env=clean_env(),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            assert watching.stdout is not None
            seen: list[str] = []
            try:
                async with asyncio.timeout(60):
                    await read_until(watching.stdout, seen, r"^  gpu-a +False +CapWriteFailed ")
                    await read_until(watching.stdout, seen, r"^  gpu-a +True +CapsEnforced ")
                    if rows_of(seen, "gpu-c")[-1][1:] != ["Unknown", "AgentUnreachable"]:
                        await read_until(watching.stdout, seen, r"^  gpu-c +Unknown +AgentUnr")
            finally:
                if watching.returncode is None:
                    watching.send_signal(signal.SIGTERM)
                async with asyncio.timeout(10):
                    _, err = await watching.communicate()
    assert (watching.returncode, err) == (0, b"")
    assert seen[0].startswith("cluster  controller "), seen
    assert seen[1].split()[:3] == ["NODE", "STATUS", "REASON"], seen
    a_rows = rows_of(seen, "gpu-a")
    assert a_rows.index(["gpu-a", "False", "CapWriteFailed"]) < len(a_rows) - 1
    assert a_rows[-1] == ["gpu-a", "True", "CapsEnforced"]
    assert all(row[1] in ("True", "Unknown") for row in rows_of(seen, "gpu-b"))
    failing = next(line for line in seen if "CapWriteFailed" in line)
    assert "gpu0 (GPU-d0000000-0000-4000-8000-000000000000): write_failed" in failing
