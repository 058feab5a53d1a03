"""``capwatch demo``: the story it tells, on a terminal and off one, and that it trusts
nothing it did not start and leaves nothing behind."""

from __future__ import annotations

import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from capwatch.cli import main
from capwatch.kit.scratch import sweep
from tests.terminal import RED, REDRAW, read_until_exit, spawn, terminal_env, visible_lines

ROOT = Path(__file__).resolve().parent.parent
CAPWATCH = [sys.executable, "-m", "capwatch.cli"]
# Every port chosen by the demo itself: no fixed ports in tests.
FREE_PORTS = ["--grpc-listen", "127.0.0.1:0", "--readyz-port", "0", "--metrics-port", "0"]

pytestmark = pytest.mark.slow


def demo(*argv: str, env: dict[str, str] | None = None, timeout: float = 60):
    return subprocess.run(
        [*CAPWATCH, "demo", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=ROOT,
        env=env,
    )


def test_demo_tells_the_whole_story_and_leaves_no_state_behind(tmp_path: Path):
    """Off a terminal: the first cycle's table, then only the cycles that changed
    something, and /readyz going 503 -> 200 -> 503 -> 200 as the built-in scenario's write
    fault comes and goes, then 503 -> 200 as its GPU 4 is lost and answers again; GPU 5
    capped through its claim in cycle 3, while it still draws idle power, its process
    drawing up to that cap from cycle 5; caps restored at the end, and its temporary
    state directory (and simulated /proc) removed."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("COLUMNS", None)
    proc = demo("--cycles", "17", "--interval", "0.5", *FREE_PORTS, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    out = proc.stdout
    assert "capwatch watch --target 127.0.0.1:" in out
    headings = [line.split()[1] for line in out.splitlines() if line.startswith("cycle ")]
    # 1: all; 3: the batch pod bound, its GPU capped through its claim; 4: the write
    # fails; 5: the batch job's process starts; 7: the write recovers; 9: the pod and
    # its claim left, its GPU released; 10: that GPU idle; 12: GPU 4 lost; 15: GPU 4 back
    assert headings == ["1", "3", "4", "5", "7", "9", "10", "12", "15"], out
    gpu5, cycle = [], ""
    for line in out.splitlines():
        cells = line.split()
        if line.startswith("cycle "):
            cycle = cells[1]
        elif cycle in ("3", "5") and cells[:1] == ["5"]:
            # GPU HEALTH UUID OUTCOME REASON OWNERS REQ-W RES-W APPLIED SOURCE POWER
            gpu5.append(
                (
                    cells[3],
                    cells[5],
                    " ".join(cells[8:10]),
                    " ".join(cells[10:12]),
                    " ".join(cells[12:]),
                )
            )
    claim = "claim batch/nightly-etl-gpu"  # SOURCE names the claim
    assert gpu5 == [
        ("enforced", "batch/nightly-etl", "250 W", claim, "70 W"),  # no process yet
        ("enforced", "batch/nightly-etl", "250 W", claim, "250 W*"),  # held at its cap
    ], out
    answers = [line.split(":")[0] for line in out.splitlines() if line.startswith(">>>")]
    assert answers == [">>> /readyz 503", ">>> /readyz 200"] * 3, out
    assert "cycle-failed: gpu0:write_failed" in out
    assert "cycle-failed: gpu4:uuid_read_failed" in out
    assert "uuid_read_failed:gpu_is_lost" in out
    assert out.rstrip().endswith("stopped: default power limit restored on 4 GPU(s)")
    assert list(tmp_path.iterdir()) == []


def test_demo_on_a_terminal_fits_80_columns_colours_and_redraws():
    """On an 80-column terminal no line is wider than 80, failures are red, and the
    table is redrawn in place while the /readyz changes scroll above it."""
    process, master = spawn(
        [*CAPWATCH, "demo", "--cycles", "8", "--interval", "0.5", *FREE_PORTS],
        columns=80,
        env={**terminal_env(os.environ), "PYTHONPATH": str(ROOT)},
    )
    drawn = read_until_exit(process, master, 60)
    assert process.returncode == 0, drawn
    lines = visible_lines(drawn)
    assert max(len(line) for line in lines) <= 80, [line for line in lines if len(line) > 80]
    assert any(line.startswith(">>> /readyz 503: not ready: cycle-failed") for line in lines)
    failing = [chunk for chunk in drawn.split("\n") if "write_failed:no_permission" in chunk]
    assert failing
    assert all(RED.search(chunk) for chunk in failing)
    assert REDRAW in drawn
    assert lines[-1].startswith("stopped: default power limit restored on ")


def test_demo_flags_have_environment_twins(capsys):
    """Each demo flag has its twin, as the README promises: the demo runs from the
    environment alone, and a bad twin is named in one line, exit 2."""
    env = {
        **os.environ,
        "CAPWATCH_DEMO_CYCLES": "2",
        "CAPWATCH_INTERVAL": "0.2",
        "CAPWATCH_GRPC_LISTEN": "127.0.0.1:0",
        "CAPWATCH_READYZ_PORT": "0",
        "CAPWATCH_METRICS_PORT": "0",
    }
    proc = demo(env=env)  # without its twin, --cycles is unset: it would run for ever
    assert proc.returncode == 0, proc.stderr
    assert "stopped: default power limit restored" in proc.stdout
    assert "a cycle every 0.2s" in proc.stdout
    assert "metrics: off" in proc.stdout
    assert main(["demo"], {"CAPWATCH_DEMO_CYCLES": "lots"}) == 2
    assert capsys.readouterr().err == (
        "capwatch demo: error: --cycles (from $CAPWATCH_DEMO_CYCLES): must be a positive "
        "integer, got 'lots'\n"
    )


@pytest.fixture
def stranger() -> Iterator[int]:
    """Someone else's HTTP server, answering 200 ok on every path."""

    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok: someone else's answer\n")

        def log_message(self, *args: object) -> None:
            return

    server = http.server.HTTPServer(("127.0.0.1", 0), Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def test_demo_whose_readyz_port_is_taken_fails_in_one_line(stranger: int):
    """With another server on the readyz port the demo does not show that server's
    answers as its shim's: it stops at once with one plain line saying why."""
    proc = demo("--readyz-port", str(stranger), "--grpc-listen", "127.0.0.1:0", "--metrics-port=0")
    assert proc.returncode == 1
    assert ">>> /readyz" not in proc.stdout
    assert proc.stderr == (  # a plain line: no Python list, no tuple of an address
        "capwatch demo: cannot start: the readiness shim did not start: capwatch shim: "
        f"cannot start: --readyz-port: cannot serve /readyz on 127.0.0.1:{stranger}: "
        "address already in use\n"
    )


def test_demo_whose_grpc_port_is_taken_fails_in_one_line():
    """A gRPC port in use: one line naming the flag, nothing else printed."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = demo("--grpc-listen", f"127.0.0.1:{port}", "--readyz-port=0", "--metrics-port=0")
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == (
        f"capwatch demo: cannot start: --grpc-listen: cannot listen on 127.0.0.1:{port}: "
        "address already in use\n"
    )


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; only its exit status waits to be read


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_demo_children_die_with_it_even_on_sigkill(tmp_path: Path):
    """SIGKILL the demo (no handler runs): its readiness shim does not outlive it, and the
    directories it could not remove (its state, the simulated /proc) are the next start's
    to remove, as a process that is gone left them."""
    log = tmp_path / "out"
    with log.open("w") as out:
        process = subprocess.Popen(
            [*CAPWATCH, "demo", "--interval", "0.5", *FREE_PORTS],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
            env={**os.environ, "TMPDIR": str(tmp_path)},  # what it leaves, left here
        )
    try:
        deadline = time.monotonic() + 30
        while ">>> /readyz" not in log.read_text():
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        children = _children(process.pid)
        assert children, "the demo runs its shim as a child process"
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        deadline = time.monotonic() + 20
        while any(_alive(child) for child in children):
            assert time.monotonic() < deadline, f"still running: {children}"
            time.sleep(0.05)
    finally:
        process.kill()
        for child in _children(process.pid):
            os.kill(child, signal.SIGKILL)
    prefixes = ("capwatch-demo-state-", "capwatch-sim-proc-")
    left = sorted(path.name for path in tmp_path.glob(f"capwatch-*-{process.pid}-*"))
    assert [name.split(str(process.pid))[0] for name in left] == sorted(prefixes), left
    removed = [path.name for prefix in prefixes for path in sweep(prefix, tmp_path)]
    assert sorted(removed) == left
    assert list(tmp_path.glob("capwatch-*")) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_demo_whose_shim_dies_stops_and_says_so(tmp_path: Path):
    """A shim that dies mid-demo stops the demo (caps restored), exit 1 with one line on
    stderr: /readyz answers are not silently missing."""
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("w") as stdout, err.open("w") as stderr:
        process = subprocess.Popen(
            [*CAPWATCH, "demo", "--interval", "0.5", *FREE_PORTS],
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
        )
    try:
        deadline = time.monotonic() + 30
        while ">>> /readyz" not in out.read_text():
            assert process.poll() is None, err.read_text()
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.05)
        (shim,) = _children(process.pid)
        os.kill(shim, signal.SIGKILL)
        assert process.wait(timeout=30) == 1
    finally:
        process.kill()
    assert "stopped: default power limit restored" in out.read_text()
    assert err.read_text() == "capwatch demo: the readiness shim was killed by signal 9\n"
