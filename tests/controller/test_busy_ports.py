"""``capwatch controller`` with a port another process holds: one line that names the
flag, the address and the reason (errno's words), exit 1, before anything is followed."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

CAPWATCH = [sys.executable, "-m", "capwatch.cli"]


@pytest.mark.parametrize(
    ("flag", "words"),
    [("--probe-port", "cannot listen on"), ("--metrics-port", "cannot serve metrics on")],
)
def test_a_busy_port_is_one_line_naming_its_flag(tmp_path: Path, flag: str, words: str) -> None:
    """The probe or metrics port in use: "--probe-port: cannot listen on 0.0.0.0:PORT:
    address already in use", not asyncio's tuple of an address or a bare strerror."""
    targets = tmp_path / "targets"
    targets.write_text("gpu-1 127.0.0.1:50051\n")
    ports = {"--probe-port": "0", "--metrics-port": "0"}
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        ports[flag] = str(port)
        done = subprocess.run(
            [
                *CAPWATCH,
                "controller",
                *("--dry-run", "--targets", str(targets), "--grpc-listen", "127.0.0.1:0"),
                *(part for item in ports.items() for part in item),
                "--log-level=warning",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        f"capwatch controller: cannot start: {flag}: {words} 0.0.0.0:{port}: "
        "address already in use\n"
    )
