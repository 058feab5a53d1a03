"""``capwatch watch`` end to end against a real agent server."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import signal
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from server.cli import main
from server.watch import add_watch_arguments, watch, watch_settings
from tests.client.support import eventually
from tests.server.harness import UUIDS, ServerHarness, failed, ok, restart_harness

ROOT = Path(__file__).resolve().parents[2]


async def capwatch_watch(capsys: pytest.CaptureFixture[str], *argv: str, env=None):
    """Run ``capwatch watch`` in-process (its own event loop, in a thread); (rc, out, err)."""
    async with asyncio.timeout(5):
        rc = await asyncio.to_thread(main, ["watch", *argv], env or {})
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def parsed(*argv: str):
    parser = argparse.ArgumentParser()
    add_watch_arguments(parser)
    return watch_settings(parser.parse_args(argv), {})


@pytest.mark.asyncio
async def test_json_count_prints_that_many_json_lines(harness: ServerHarness, capsys):
    """--json --count 3: exactly three lines, each a WatchResponse as JSON, snapshot first."""
    harness.publish()
    rc, out, err = await capwatch_watch(
        capsys, "--target", harness.target, "--json", "--count", "3", "--heartbeat", "1"
    )
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    assert len(lines) == 3
    messages = [json.loads(line) for line in lines]
    assert list(messages[0]) == ["snapshot"]
    assert messages[0]["snapshot"]["nodeName"] == "node-under-test"
    assert [list(m) for m in messages[1:]] == [["heartbeat"], ["heartbeat"]]
    assert messages[1]["heartbeat"]["lastSequence"] == "1"


@pytest.mark.asyncio
async def test_json_since_prints_the_missed_cycles(harness: ServerHarness, capsys):
    """--since 1 resumes: cycles 2 and 3 come first, no snapshot; env twins work too."""
    for _ in range(3):
        harness.publish()
    rc, out, _ = await capwatch_watch(
        capsys,
        "--since",
        "1",
        env={
            "CAPWATCH_TARGET": harness.target,
            "CAPWATCH_WATCH_JSON": "true",
            "CAPWATCH_WATCH_COUNT": "2",
        },
    )
    assert rc == 0
    messages = [json.loads(line) for line in out.splitlines()]
    assert [m["cycle"]["sequence"] for m in messages] == ["2", "3"]


@pytest.mark.asyncio
async def test_table_mode_prints_a_row_per_gpu_and_heartbeat_lines(harness: ServerHarness, capsys):
    """The default output: the snapshot as a GPU table, then one line per heartbeat."""
    harness.publish([ok(0), failed(1), ok(2)])
    rc, out, _ = await capwatch_watch(
        capsys, "--target", harness.target, "--count", "2", "--heartbeat", "1"
    )
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith("snapshot  node node-under-test")
    assert "NOT READY: cycle_failed" in lines[0]
    assert lines[1].split()[:4] == ["GPU", "HEALTH", "UUID", "OUTCOME"]
    rows = [line.split() for line in lines[2:5]]
    assert [row[:2] for row in rows] == [["0", "healthy"], ["1", "unhealthy"], ["2", "healthy"]]
    assert rows[1][3:5] == ["failed", "write_failed:no_permission"]
    assert lines[5] == ""
    assert lines[6].startswith("heartbeat  ")
    assert "cycle 1" in lines[6]
    assert len(lines) == 7


@pytest.mark.asyncio
async def test_table_mode_prints_each_cycle(harness: ServerHarness, capsys):
    """A cycle is a heading (sequence, verdict) and one row per GPU the filter keeps."""
    harness.publish()
    harness.publish()
    rc, out, _ = await capwatch_watch(
        capsys, "--target", harness.target, "--since", "1", "--count", "1", "--gpu", UUIDS[2]
    )
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith("cycle 2  ")
    assert "  ENFORCED  " in lines[0]
    assert [line.split()[0] for line in lines[1:] if line] == ["GPU", "2"]


@pytest.mark.asyncio
@pytest.mark.parametrize("version", ["v1", "v1alpha1"])
async def test_dra_prints_the_device_list(harness: ServerHarness, capsys, version: str):
    """--dra v1|v1alpha1 --count 1: the kubelet's full device list, as a table."""
    harness.publish([ok(0), failed(1), ok(2)])
    rc, out, _ = await capwatch_watch(
        capsys, "--target", harness.target, "--dra", version, "--count", "1"
    )
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == f"DRA {version} device list  3 devices"
    rows = [line.split()[:3] for line in lines[2:] if line]
    assert rows == [
        ["node-under-test", "gpu-0", "healthy"],
        ["node-under-test", "gpu-1", "unhealthy"],
        ["node-under-test", "gpu-2", "healthy"],
    ]


@pytest.mark.asyncio
async def test_dra_json(harness: ServerHarness, capsys):
    """--dra with --json prints the NodeWatchResourcesResponse as one JSON line."""
    rc, out, _ = await capwatch_watch(
        capsys, "--target", harness.target, "--dra", "v1", "--json", "--count", "1"
    )
    assert rc == 0
    (line,) = out.splitlines()
    devices = json.loads(line)["devices"]
    assert [d["device"]["deviceName"] for d in devices] == ["gpu-0", "gpu-1", "gpu-2"]


@pytest.mark.asyncio
async def test_disconnect_reconnect_and_resync_lines(
    harness: ServerHarness, servers: list[ServerHarness]
):
    """A restarted agent shows as a disconnect line, a reconnect line and a resync snapshot."""
    harness.publish()
    out, err = io.StringIO(), io.StringIO()
    settings = parsed("--target", harness.target, "--count", "2", "--heartbeat", "60")
    task = asyncio.create_task(watch(settings, out=out, err=err))
    await eventually(lambda: "snapshot" in out.getvalue())
    async with asyncio.timeout(3):
        servers.append(await restart_harness(harness, same_instance=False))
        assert await task == 0
    text = out.getvalue()
    assert f"disconnected from {harness.target}: stream ended by the agent; retrying in" in text
    assert f"reconnected to {harness.target}" in text
    assert "resync: the agent restarted; showing its current state" in text
    assert text.index("disconnected") < text.index("reconnected") < text.index("resync:")
    assert text.count("snapshot") == 2
    assert err.getvalue() == ""


@pytest.mark.asyncio
async def test_request_the_agent_refuses_exits_1(harness: ServerHarness):
    """An error retrying cannot fix (INVALID_ARGUMENT) ends the watch: exit 1, one line."""
    # Longer than the agent accepts (the flag itself refuses it; a library caller may not).
    settings = replace(parsed("--target", harness.target), uuids=("GPU-" + "f" * 200,))
    out, err = io.StringIO(), io.StringIO()
    async with asyncio.timeout(3):
        assert await watch(settings, out=out, err=err) == 1
    assert err.getvalue().count("\n") == 1
    assert err.getvalue().startswith(f"capwatch watch: {harness.target}: INVALID_ARGUMENT: ")


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (["--count", "0"], {}, "--count: must be a positive integer"),
        (["--count", "x"], {}, "--count: must be a positive integer"),
        ([], {"CAPWATCH_WATCH_COUNT": "-1"}, "--count (from $CAPWATCH_WATCH_COUNT): must be"),
        (["--since", "-3"], {}, "--since: must be a cycle sequence number"),
        (["--heartbeat", "0"], {}, "--heartbeat: must be between 1.0 and 3600"),
        (["--heartbeat", "soon"], {}, "--heartbeat: not a number"),
        (["--target", "localhost"], {}, "--target: expected unix:///path or host:port"),
        (["--target", "unix://relative"], {}, "--target: unix socket path must be absolute"),
        (["--dra", "v2"], {}, "--dra: must be one of v1, v1alpha1"),
        (["--dra", "v1", "--since", "4"], {}, "--since: applies to the capwatch.v1 stream"),
        (["--gpu", "gpu zero"], {}, "--gpu: expected a GPU index or UUID"),
        ([], {"CAPWATCH_WATCH_JSON": "maybe"}, "--json (from $CAPWATCH_WATCH_JSON): must be"),
        (["--tls-cert", "/etc/hostname"], {}, "--tls-cert: --tls-cert and --tls-key go together"),
        (["--tls-ca", "/nonexistent.pem", "--target", "h:1"], {}, "--tls-ca: /nonexistent.pem"),
        (["--tls-ca", "/etc/hostname"], {}, "--tls-ca: TLS is for TCP targets"),
    ],
)
def test_invalid_flags_exit_2_with_one_line(argv, env, expected, capsys):
    """Each bad flag or environment twin: exit 2, one line naming it and the reason."""
    assert main(["watch", *argv], env) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("capwatch watch: error: ")
    assert expected in err


def test_unknown_flag_exits_2_with_one_line(capsys):
    """argparse's own errors for watch are one line too."""
    with pytest.raises(SystemExit) as exc:
        main(["watch", "--jsn"], {})
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "unrecognized arguments: --jsn" in err


@pytest.mark.asyncio
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_signal_exits_0_quietly(harness: ServerHarness, sig: signal.Signals):
    """Ctrl-C or SIGTERM while watching: exit 0, nothing on stderr."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "server.cli",
        "watch",
        "--target",
        harness.target,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    async with asyncio.timeout(10):
        first = await process.stdout.readline()
        assert first.startswith(b"snapshot  node node-under-test")
        process.send_signal(sig)
        _, err = await process.communicate()
    assert (process.returncode, err) == (0, b"")
