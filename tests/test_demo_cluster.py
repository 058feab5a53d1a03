"""``capwatch demo --cluster`` over real processes: a pool, a controller in --dry-run and the
cluster stream; nodes go False and back to True; Ctrl-C or a SIGKILL ends every part."""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from capwatch.agent.sim.poolspec import node_names, parse_fault
from capwatch.cli import main
from capwatch.demo.cluster import NODES, SCHEDULE, cluster_faults, schedule_lines
from capwatch.pool import add_pool_arguments, pool_command
from tests.test_demo import _alive, _children

ROOT = Path(__file__).resolve().parent.parent
CAPWATCH = [sys.executable, "-m", "capwatch.cli"]
INTERVAL = 0.3  # the schedule scales with it: the first write fails ~5 s in
PORTS = {"--grpc-listen": "127.0.0.1:0", "--cluster-listen": "127.0.0.1:0"}
FREE = ["--interval", str(INTERVAL), *(f"{flag}={value}" for flag, value in PORTS.items())]
ROW = re.compile(r"^  (?P<node>sim-node-\d+)\s+(?P<status>True|False|Unknown)\s+(?P<reason>\w+)")

pytestmark = pytest.mark.slow


@contextmanager
def cluster_demo(tmp_path: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """The demo, piped (stdout in tmp_path/out, stderr in tmp_path/err); killed after."""
    with (tmp_path / "out").open("wb") as out, (tmp_path / "err").open("wb") as err:
        process = subprocess.Popen(
            [*CAPWATCH, "demo", "--cluster", *FREE],
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
            env=env,
        )
    try:
        yield process
    finally:
        children = _children(process.pid)
        process.kill()
        process.wait(timeout=10)
        for child in children:
            if _alive(child):
                os.kill(child, signal.SIGKILL)


def rows(out: str) -> list[tuple[str, str, str]]:
    """Every per-node row the demo printed from the cluster stream, in order."""
    found = []
    for line in out.splitlines():
        match = ROW.match(line)
        if match:
            found.append((match["node"], match["status"], match["reason"]))
    return found


def recovered(out: str) -> set[str]:
    """Nodes shown False CapWriteFailed and then True CapsEnforced."""
    failed, back = set(), set()
    for node, status, reason in rows(out):
        if (status, reason) == ("False", "CapWriteFailed"):
            failed.add(node)
        elif (status, reason) == ("True", "CapsEnforced") and node in failed:
            back.add(node)
    return back


def wait_until(process: subprocess.Popen[bytes], out: Path, done, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        text = out.read_text(errors="replace")
        if done(text):
            return text
        assert process.poll() is None, text
        assert time.monotonic() < deadline, text
        time.sleep(0.1)


@pytest.mark.timeout(90)
def test_the_cluster_demo_shows_failing_nodes_go_false_and_back_to_true(tmp_path: Path):
    """Piped: the cluster table from the controller's stream, the controller's dry-run PATCH
    and Event lines; a node whose cap writes fail goes False CapWriteFailed (a Warning
    Event, a PATCH) and back to True (a Normal Event, a PATCH). Only nodes the write fault
    hits ever go False. Ctrl-C (SIGINT) ends the demo, its pool and its controller: exit 0,
    nothing on stderr, its temporary directory gone."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("COLUMNS", None)
    (tmp_path / "logs").mkdir()
    with cluster_demo(tmp_path / "logs", env) as process:
        out = tmp_path / "logs" / "out"
        wait_until(process, out, recovered, 60)
        children = _children(process.pid)
        assert len(children) == 2, "the pool and the controller are child processes"
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 0
        deadline = time.monotonic() + 10
        while any(_alive(child) for child in children):
            assert time.monotonic() < deadline, f"still running: {children}"
            time.sleep(0.05)
    text = out.read_text()
    assert (tmp_path / "logs" / "err").read_text() == ""
    assert text.rstrip().endswith("stopped: the controller and the pool have ended")
    assert text.startswith(f"capwatch demo --cluster: {NODES} simulated nodes")
    write_fault = parse_fault("--fault", cluster_faults(INTERVAL)[0], slot=0)
    hit = {n for n in node_names(NODES, prefix="sim-node-") if write_fault.hits(n)}
    node = sorted(recovered(text))[0]
    assert node in hit
    assert {n for n, status, _ in rows(text) if status == "False"} <= hit
    patches = [line for line in text.splitlines() if line.startswith(f"PATCH nodes/{node}/")]
    went = [p.split()[2] for p in patches]
    assert "GPUPowerCapEnforced=False" in went
    assert "GPUPowerCapEnforced=True" in went[went.index("GPUPowerCapEnforced=False") :]
    assert f"EVENT Warning node/{node} CapWriteFailed: gpu0 " in text
    assert f"EVENT Normal node/{node} CapsEnforced: " in text
    assert [p.name for p in tmp_path.iterdir()] == ["logs"]


@pytest.mark.timeout(60)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_cluster_demos_children_die_with_it_even_on_sigkill(tmp_path: Path):
    """SIGKILL the demo once it shows the cluster (no handler runs): neither its pool nor its
    controller outlives it."""
    with cluster_demo(tmp_path, dict(os.environ)) as process:
        wait_until(process, tmp_path / "out", lambda t: f"{NODES} nodes:" in t, 40)
        children = _children(process.pid)
        assert len(children) == 2
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        deadline = time.monotonic() + 20
        while any(_alive(child) for child in children):
            assert time.monotonic() < deadline, f"still running: {children}"
            time.sleep(0.05)


@pytest.mark.parametrize("flag", ["--grpc-listen", "--cluster-listen"])
def test_a_cluster_demo_port_in_use_stops_it_in_one_line(flag: str):
    """The pool's or the controller's port in use: one line naming the flag, exit 1, nothing
    started (nothing printed, no child left)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        ports = {**PORTS, flag: f"127.0.0.1:{port}"}
        proc = subprocess.run(
            [*CAPWATCH, "demo", "--cluster", *(f"{k}={v}" for k, v in ports.items())],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=ROOT,
        )
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == (
        f"capwatch demo: cannot start: {flag}: cannot listen on 127.0.0.1:{port}: "
        "address already in use\n"
    )


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--cycles", "3"], "--cycles: not with --cluster"),
        (["--scenario", "x.yaml"], "--scenario: not with --cluster"),
        (
            ["--grpc-listen", "unix:///tmp/x.sock"],
            "--grpc-listen: with --cluster: one host:port, where the pool serves",
        ),
        (["--interval", "0.05"], "--interval: must be at least 0.1s with --cluster"),
        (["--cluster-listen", "nowhere"], "--cluster-listen: expected host:port, got 'nowhere'"),
    ],
)
def test_what_the_cluster_demo_cannot_take_is_one_line_exit_2(
    argv: list[str], expected: str, capsys
):
    """A scenario, a cycle count, a unix socket or too short an interval: exit 2, one line."""
    assert main(["demo", "--cluster", *argv], {}) == 2
    assert capsys.readouterr().err == f"capwatch demo: error: {expected}\n"


def test_the_cluster_flag_has_its_environment_twin(capsys):
    """$CAPWATCH_DEMO_CLUSTER turns the cluster demo on, as the flag does."""
    assert main(["demo", "--cycles", "3"], {"CAPWATCH_DEMO_CLUSTER": "true"}) == 2
    assert capsys.readouterr().err == "capwatch demo: error: --cycles: not with --cluster\n"


def test_the_schedule_scales_with_the_interval_and_parses():
    """The pool's --fault values: write failures, hangs and silences, each a window that
    scales with the interval after a fixed lead, and repeats; all valid for the pool."""
    assert cluster_faults(1.0) == (
        "write_failed:0.4@8+8/40",
        "hang:0.02@14+10/40",
        "hang:0.02@14+10/40",
        "silent:0.1@20+8/40",
        "silent:0.12@20+8/40",
    )
    for interval in (0.1, 0.3, 1.0, 15.0):
        faults = [parse_fault("--fault", f) for f in cluster_faults(interval)]
        assert [f.kind.value for f in faults] == [kind for kind, *_ in SCHEDULE]
        assert all(f.every_s == pytest.approx(40 * interval) for f in faults)


def hit_by_the_pool(interval: float) -> dict[str, set[str]]:
    """Which nodes each kind of fault hits, as the pool decides it from the demo's flags
    (capwatch pool's own parsing, each --fault in its place, and its hit rule)."""
    parser = argparse.ArgumentParser()
    add_pool_arguments(parser)
    flags = [f"--nodes={NODES}", *(f"--fault={fault}" for fault in cluster_faults(interval))]
    pool = pool_command(parser.parse_args(flags), {}).pool
    names = node_names(pool.nodes, prefix=pool.name_prefix, first=pool.first_index)
    hit: dict[str, set[str]] = {}
    for fault in pool.faults:
        hit.setdefault(fault.kind.value, set()).update(n for n in names if fault.hits(n))
    return hit


@pytest.mark.parametrize("interval", [0.3, 1.0])
def test_the_pool_hits_four_write_failures_two_hangs_and_two_silences(interval: float):
    """What the docstring and the README say: 4 of the 12 nodes' writes fail, 2 hang and 2
    go silent, 8 different nodes (the pool picks a fault's nodes by a hash: the demo's
    fractions must make it pick exactly that many, and no node twice)."""
    hit = hit_by_the_pool(interval)
    assert {kind: len(nodes) for kind, nodes in hit.items()} == {
        "write_failed": 4,
        "hang": 2,
        "silent": 2,
    }
    assert len(set().union(*hit.values())) == 8


def test_the_demo_announces_exactly_the_nodes_the_pool_hits():
    """The intro names, for each kind of fault, the nodes the pool will hit with it (and
    when, and for how long, and what the controller shows for it)."""
    hit = hit_by_the_pool(1.0)
    assert hit == {
        "write_failed": {"sim-node-1", "sim-node-8", "sim-node-10", "sim-node-11"},
        "hang": {"sim-node-2", "sim-node-9"},
        "silent": {"sim-node-4", "sim-node-7"},
    }
    (line,) = schedule_lines(1.0)
    assert (
        "from about 8s the cap writes of sim-node-1, sim-node-8, sim-node-10 and sim-node-11 "
        "fail for 8s (False, CapWriteFailed); "
        "from about 14s sim-node-2 and sim-node-9 hang for 10s (Unknown, CycleStale); "
        "from about 20s sim-node-4 and sim-node-7 go silent for 8s (Unknown, AgentUnreachable)"
    ) in line
    assert "The other 4 nodes stay True." in line
    for kind, nodes, _, _ in SCHEDULE:
        assert set(nodes) <= hit[kind]


@pytest.mark.timeout(60)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("part", ["pool", "controller"])
def test_a_part_that_dies_stops_the_cluster_demo_and_says_so(part: str, tmp_path: Path):
    """The pool or the controller killed mid-demo: the demo stops the other part and exits 1
    with one line on stderr saying which died and how (its conditions would be lies)."""
    with cluster_demo(tmp_path, dict(os.environ)) as process:
        wait_until(process, tmp_path / "out", lambda t: f"{NODES} nodes:" in t, 40)
        children = _children(process.pid)
        (victim,) = (c for c in children if f"\0{part}\0" in Path(f"/proc/{c}/cmdline").read_text())
        os.kill(victim, signal.SIGKILL)
        assert process.wait(timeout=30) == 1
        deadline = time.monotonic() + 10
        while any(_alive(child) for child in children):
            assert time.monotonic() < deadline, f"still running: {children}"
            time.sleep(0.05)
    assert (tmp_path / "err").read_text() == f"capwatch demo: the {part} was killed by signal 9\n"
