"""``capwatch watch --cluster`` end to end against the controller's real cluster stream
(served in-process from node states the test sets: tests/client/cluster_rig.py)."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from capwatch.cli import main
from capwatch.controller.conditions import AgentLink
from capwatch.watch.command import add_watch_arguments, watch, watch_settings
from tests.client.cluster_rig import ClusterRig, new_view, start_rig
from tests.client.support import eventually
from tests.server.harness import ServerHarness
from tests.terminal import RED, REDRAW, read_until_exit, spawn, terminal_env, visible_lines

ROOT = Path(__file__).resolve().parents[2]
OTHER_INSTANCE = "0badc0de-0000-4000-8000-000000000000"


@pytest_asyncio.fixture
async def rigs() -> AsyncIterator[list[ClusterRig]]:
    """Rigs a test starts (or serves again) go here; all are stopped after."""
    started: list[ClusterRig] = []
    yield started
    for rig in started:
        await rig.stop()


@pytest_asyncio.fixture
async def rig(rigs: list[ClusterRig]) -> ClusterRig:
    """Three nodes: gpu-a enforced, gpu-b failing GPU 1, gpu-c unreachable (updates 1-3)."""
    started = await start_rig()
    rigs.append(started)
    started.set("gpu-a")
    started.set("gpu-b", failing=(1,))
    started.set("gpu-c", link=AgentLink.UNREACHABLE, error="UNAVAILABLE: connection refused")
    return started


async def capwatch_watch(capsys: pytest.CaptureFixture[str], *argv: str, env=None):
    """``capwatch watch`` as its flags and twins read, on this test's event loop (see
    tests/client/test_watch.py for why not main() in a thread); (rc, out, err)."""
    out, err = io.StringIO(), io.StringIO()
    async with asyncio.timeout(10):
        rc = await watch(parsed(*argv, env=env), out=out, err=err)
    return rc, out.getvalue(), err.getvalue()


def parsed(*argv: str, env=None):
    parser = argparse.ArgumentParser()
    add_watch_arguments(parser)
    return watch_settings(parser.parse_args(argv), env or {})


async def sent_snapshot(rig: ClusterRig) -> None:
    """Until a stream has sent its snapshot and waits for the next update."""
    await eventually(lambda: rig.view.broadcast.waiting >= 1, timeout=10)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.asyncio
async def test_json_prints_each_response_with_proto_names_and_zero_values(rig: ClusterRig, capsys):
    """--json --count 3: three ClusterHealthServiceWatchResponse objects, one per line:
    the snapshot, then heartbeats; fields spelled as the proto, zero values printed
    (shard index 0, GPU 0's index, resync false, an empty agent_error)."""
    rc, out, err = await capwatch_watch(
        capsys, "--cluster", "--target", rig.target, "--json", "--count", "3", "--heartbeat", "1"
    )
    assert (rc, err) == (0, "")
    messages = [json.loads(line) for line in out.splitlines()]
    assert [list(m) for m in messages] == [["snapshot"], ["heartbeat"], ["heartbeat"]]
    snapshot = messages[0]["snapshot"]
    assert snapshot["controller_instance_id"] == rig.view.instance_id
    assert snapshot["shard"]["index"] == 0
    assert snapshot["resync"] is False
    assert [n["node_name"] for n in snapshot["nodes"]] == ["gpu-a", "gpu-b", "gpu-c"]
    assert snapshot["nodes"][0]["gpus"][0]["index"] == 0
    assert snapshot["nodes"][0]["agent_error"] == ""
    assert snapshot["nodes"][1]["condition"]["status"] == "CONDITION_STATUS_FALSE"
    assert messages[1]["heartbeat"]["last_sequence"] == "3"
    assert not [key for key in _keys(messages) if any(c.isupper() for c in key)]


def _keys(value: object) -> list[str]:
    if isinstance(value, dict):
        return [*value, *(k for v in value.values() for k in _keys(v))]
    if isinstance(value, list):
        return [k for v in value for k in _keys(v)]
    return []


@pytest.mark.asyncio
async def test_json_update_lines_and_resume_with_since_and_instance(rig: ClusterRig, capsys):
    """--since 1 --instance ID (env twins here) resumes: the missed updates come first,
    no snapshot, each one JSON line with its node (and removed false)."""
    rc, out, _ = await capwatch_watch(
        capsys,
        env={
            "CAPWATCH_WATCH_CLUSTER": "true",
            "CAPWATCH_TARGET": rig.target,
            "CAPWATCH_WATCH_JSON": "true",
            "CAPWATCH_WATCH_SINCE": "1",
            "CAPWATCH_WATCH_INSTANCE": rig.view.instance_id,
            "CAPWATCH_WATCH_COUNT": "2",
        },
    )
    assert rc == 0
    messages = [json.loads(line)["update"] for line in out.splitlines()]
    assert [(m["sequence"], m["node"]["node_name"], m["removed"]) for m in messages] == [
        ("2", "gpu-b", False),
        ("3", "gpu-c", False),
    ]


@pytest.mark.asyncio
async def test_table_prints_the_snapshot_then_a_line_per_changed_node(rig: ClusterRig):
    """Not on a terminal: the snapshot as a whole nodes table, then one line per node
    that changed, under the same columns; a node that left says so."""
    out, err = io.StringIO(), io.StringIO()
    settings = parsed("--cluster", "--target", rig.target, "--count", "4")
    task = asyncio.create_task(watch(settings, out=out, err=err))
    await sent_snapshot(rig)
    rig.set("gpu-b")  # recovers
    rig.set("gpu-a", failing=(0, 3))
    rig.remove("gpu-c")
    async with asyncio.timeout(5):
        assert await task == 0
    lines = out.getvalue().splitlines()
    assert lines[0].startswith(f"cluster  controller {rig.view.instance_id}  shard 0/1 leader")
    assert "update 3  3 nodes: 1 True, 1 False, 1 Unknown" in lines[0]
    header = lines[1]
    assert header.split() == ["NODE", "STATUS", "REASON", "AGENT", "GPUS", "AGE", "MESSAGE"]
    rows = [line.split(maxsplit=6) for line in lines[2:5]]
    assert [row[:6] for row in rows] == [
        ["gpu-a", "True", "CapsEnforced", "connected", "8/8", "0.5s"],
        ["gpu-b", "False", "CapWriteFailed", "connected", "7/8", "0.5s"],
        ["gpu-c", "Unknown", "AgentUnreachable", "unreachable", "8/8", "0.5s"],
    ]
    assert rows[1][6] == "gpu1 (GPU-00000001): write_failed: cap write failed: no_permission"
    assert lines[5] == ""
    changed = [line.split(maxsplit=6) for line in lines[6:]]
    assert [row[:3] for row in changed] == [
        ["gpu-b", "True", "CapsEnforced"],
        ["gpu-a", "False", "CapWriteFailed"],
        ["gpu-c", "-", "(removed)"],
    ]
    assert lines[7].index("CapWriteFailed") == header.index("REASON")
    assert err.getvalue() == ""


@pytest.mark.asyncio
async def test_columns_bounds_lines_printed_to_a_pipe(
    rig: ClusterRig, capsys, monkeypatch: pytest.MonkeyPatch
):
    """COLUMNS=80 bounds every line, the message cut to fit."""
    monkeypatch.setenv("COLUMNS", "80")
    rc, out, _ = await capwatch_watch(capsys, "--cluster", "--target", rig.target, "--count", "1")
    assert rc == 0
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "CapWriteFailed" in out
    assert "gpu1 (GPU-" in out
    assert "…" in out


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("argv", "cause"),
    [
        (["--since", "9"], "--since 9 is ahead of the controller's last update (3)"),
        (["--since", "1", "--instance", OTHER_INSTANCE], "the controller restarted"),
    ],
    ids=["ahead", "other-instance"],
)
async def test_a_resume_the_controller_cannot_serve_says_why(
    rig: ClusterRig, capsys, argv: list[str], cause: str
):
    """--since past the controller's last update, or of another controller instance, is
    answered with a resync, and the first line says why before the table."""
    rc, out, _ = await capwatch_watch(
        capsys, "--cluster", "--target", rig.target, *argv, "--count", "1"
    )
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == f"resync: {cause}; showing its current state"
    assert lines[1].startswith("cluster (resync)  controller ")


@pytest.mark.asyncio
async def test_a_restarted_controller_shows_disconnect_reconnect_and_resync(
    rig: ClusterRig, rigs: list[ClusterRig]
):
    """The controller restarts under a watch: a disconnect line, a reconnect line, a
    resync line, and the new instance's table."""
    out, err = io.StringIO(), io.StringIO()
    settings = parsed("--cluster", "--target", rig.target, "--count", "2")
    task = asyncio.create_task(watch(settings, out=out, err=err))
    await sent_snapshot(rig)
    fresh = new_view(rig.clock)
    rigs.append(again := await rig.serve_again(view=fresh))
    again.set("gpu-z")
    async with asyncio.timeout(5):
        assert await task == 0
    text = out.getvalue()
    assert "disconnected: " in text
    assert f"reconnected to {rig.target}" in text
    assert "resync: the controller restarted; showing its current state" in text
    assert text.index("disconnected") < text.index("reconnected") < text.index("resync:")
    assert f"controller {fresh.instance_id}" in text
    assert err.getvalue() == ""


def test_a_controller_never_reached_is_one_line_and_exit_1(capsys):
    """Nothing listening: one line saying why, exit 1, rather than retrying in silence."""
    target = f"127.0.0.1:{closed_port()}"
    assert main(["watch", "--cluster", "--target", target], {}) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith(f"capwatch watch: cannot reach {target}: UNAVAILABLE")
    assert captured.err.endswith(" (--retry keeps trying)\n")


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["flag", "twin"])
async def test_retry_keeps_trying_a_controller_not_up_yet(how: str, rigs: list[ClusterRig]):
    """--retry (or CAPWATCH_WATCH_RETRY=true) keeps trying, and shows the nodes once the
    controller is up."""
    port = closed_port()
    parser = argparse.ArgumentParser()
    add_watch_arguments(parser)
    argv = ["--cluster", "--target", f"127.0.0.1:{port}", "--count", "1"]
    env = {"CAPWATCH_WATCH_RETRY": "true"} if how == "twin" else {}
    settings = watch_settings(
        parser.parse_args([*argv, *(["--retry"] if how == "flag" else [])]), env
    )
    out, err = io.StringIO(), io.StringIO()
    task = asyncio.create_task(watch(settings, out=out, err=err))
    await eventually(lambda: "disconnected: " in out.getvalue(), timeout=5)
    rig = await start_rig(port=port)
    rigs.append(rig)
    rig.set("gpu-a")
    async with asyncio.timeout(15):
        assert await task == 0
    assert f"reconnected to 127.0.0.1:{port}" in out.getvalue()
    assert "1 nodes: 1 True" in out.getvalue()
    assert err.getvalue() == ""


@pytest.mark.asyncio
async def test_an_agent_is_not_a_controller(harness: ServerHarness):
    """--cluster pointed at a node agent: UNIMPLEMENTED, exit 1, one line saying where a
    controller's cluster stream is."""
    settings = parsed("--cluster", "--target", harness.target)
    out, err = io.StringIO(), io.StringIO()
    async with asyncio.timeout(5):
        assert await watch(settings, out=out, err=err) == 1
    assert err.getvalue().count("\n") == 1
    assert err.getvalue().startswith(f"capwatch watch: {harness.target}: UNIMPLEMENTED")
    assert err.getvalue().endswith(
        "(is it a capwatch controller? --cluster follows its gRPC port, 50052)\n"
    )


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (["--cluster"], {}, "--target: --cluster needs the controller's host:port"),
        ([], {"CAPWATCH_WATCH_CLUSTER": "true"}, "--target: --cluster needs the controller's"),
        ([], {"CAPWATCH_WATCH_CLUSTER": "maybe"}, "--cluster (from $CAPWATCH_WATCH_CLUSTER): must"),
        (["--cluster", "--target", "h:1", "--dra", "v1"], {}, "--dra: applies to a node agent's"),
        (["--cluster", "--target", "h:1", "--gpu", "0"], {}, "--gpu: applies to a node agent's"),
        (["--cluster", "--target", "h:1", "--heartbeat", "0.5"], {}, "--heartbeat: must be"),
        (["--cluster", "--target", "h:1", "--since", "x"], {}, "--since: must be a cycle sequence"),
        (["--instance", OTHER_INSTANCE], {}, "--instance: needs --since"),
        (["--since", "2", "--instance", "a b"], {}, "--instance: expected an instance id"),
        (["--dra", "v1", "--since", "2", "--instance", OTHER_INSTANCE], {}, "--since: applies"),
        (["--cluster", "--target", "h"], {}, "--target: expected unix:///path or host:port"),
    ],
)  # fmt: skip
def test_invalid_cluster_flags_exit_2_with_one_line(argv, env, expected, capsys):
    """Each bad flag or twin of the cluster watch: exit 2, one line naming it and why."""
    assert main(["watch", *argv], env) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("capwatch watch: error: ")
    assert expected in err


@pytest.mark.asyncio
@pytest.mark.parametrize("columns", [80, 120])
async def test_on_a_terminal_the_table_fits_colours_failures_and_redraws(
    rig: ClusterRig, columns: int
):
    """On a terminal of 80 or 120 columns: no line wider than the terminal, a failing
    node's row red, the header the same in every redraw (columns never move when a node
    fails), and each update redraws the table in place."""
    argv = ["watch", "--cluster", "--target", rig.target, "--count", "3"]
    process, master = spawn(
        [sys.executable, "-m", "capwatch.cli", *argv],
        columns=columns,
        env={**terminal_env(os.environ), "PYTHONPATH": str(ROOT)},
    )
    reading = asyncio.create_task(asyncio.to_thread(read_until_exit, process, master, 30))
    await sent_snapshot(rig)
    rig.set("gpu-a", failing=(2,))
    rig.set("gpu-b")
    drawn = await reading
    assert process.returncode == 0, drawn
    lines = visible_lines(drawn)
    assert max(len(line) for line in lines) <= columns, [x for x in lines if len(x) > columns]
    headers = {line for line in lines if line.split()[:2] == ["NODE", "STATUS"]}
    assert len(headers) == 1, headers
    failing = [chunk for chunk in drawn.split("\n") if "CapWriteFailed" in chunk]
    assert failing
    assert all(RED.search(chunk) for chunk in failing)
    assert any(line.startswith("update 4  gpu-a  True → False CapWriteFailed") for line in lines)
    assert REDRAW in drawn


@pytest.mark.asyncio
async def test_a_paged_snapshot_prints_as_sent_in_json_and_whole_in_the_table(
    rigs: list[ClusterRig], capsys
):
    """A shard of 1,001 nodes: --json prints its two snapshot messages as sent (more,
    then not), the table every node at once under one heading."""
    rig = await start_rig()
    rigs.append(rig)
    for i in range(1001):
        rig.set(f"node-{i:04d}", gpus=1)
    argv = ("--cluster", "--target", rig.target, "--count", "1")
    rc, out, _ = await capwatch_watch(capsys, *argv, "--json")
    assert rc == 0
    pages = [json.loads(line)["snapshot"] for line in out.splitlines()]
    assert [(len(p["nodes"]), p["more"]) for p in pages] == [(1000, True), (1, False)]
    rc, out, _ = await capwatch_watch(capsys, *argv)
    assert rc == 0
    lines = out.splitlines()
    assert "1001 nodes: 1001 True" in lines[0]
    assert [line.split()[0] for line in lines[2:-1]] == [f"node-{i:04d}" for i in range(1001)]
