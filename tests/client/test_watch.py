"""``capwatch watch`` end to end against a real agent server."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import re
import signal
import socket
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from capwatch.cli import main
from capwatch.client.stream_events import Disconnected
from capwatch.watch.command import add_watch_arguments, watch, watch_settings
from capwatch.watch.printer import Printer
from tests.client.support import eventually
from tests.server.harness import (
    UUIDS,
    ServerHarness,
    failed,
    ok,
    restart_harness,
    running,
    settings_for,
    start_harness,
)

ROOT = Path(__file__).resolve().parents[2]


async def capwatch_watch(capsys: pytest.CaptureFixture[str], *argv: str, env=None):
    """``capwatch watch`` as its flags and twins read, on this test's event loop; (rc, out,
    err). Not main() in a thread: grpc's one poller hands each completion to the loop its
    call was made on, and one landing after that thread's loop closed logs an error
    (into the captured stderr this asserts on)."""
    out, err = io.StringIO(), io.StringIO()
    async with asyncio.timeout(5):
        rc = await watch(parsed(*argv, env=env), out=out, err=err)
    return rc, out.getvalue(), err.getvalue()


def parsed(*argv: str, env=None):
    parser = argparse.ArgumentParser()
    add_watch_arguments(parser)
    return watch_settings(parser.parse_args(argv), env or {})


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
    assert messages[0]["snapshot"]["node_name"] == "node-under-test"
    assert [list(m) for m in messages[1:]] == [["heartbeat"], ["heartbeat"]]
    assert messages[1]["heartbeat"]["last_sequence"] == "1"


@pytest.mark.asyncio
async def test_json_has_grpcurls_field_names_and_zero_values(harness: ServerHarness, capsys):
    """--json spells fields as the proto (and grpcurl) do, and prints zero values: GPU 0
    has its index, a failed cycle says enforced false, fields never set are printed."""
    harness.publish([ok(0), failed(1), ok(2)])
    rc, out, _ = await capwatch_watch(capsys, "--target", harness.target, "--json", "--count", "1")
    assert rc == 0
    snapshot = json.loads(out)["snapshot"]
    assert [d["index"] for d in snapshot["devices"]] == [0, 1, 2]
    assert snapshot["last_cycle"]["enforced"] is False
    assert snapshot["readiness"]["ready"] is False
    assert snapshot["resync"] is False
    assert {"dra_device_name", "error_class", "process_count"} <= set(snapshot["devices"][0])
    assert not [key for key in _keys(snapshot) if any(c.isupper() for c in key)]


def _keys(value: object) -> list[str]:
    if isinstance(value, dict):
        return [*value, *(k for v in value.values() for k in _keys(v))]
    if isinstance(value, list):
        return [k for v in value for k in _keys(v)]
    return []


@pytest.mark.asyncio
async def test_since_ahead_of_the_agent_says_so(harness: ServerHarness, capsys):
    """--since past the agent's last cycle gets a resync that says why (not that the
    cycles are no longer buffered: they never existed)."""
    harness.publish()
    harness.publish()
    rc, out, _ = await capwatch_watch(
        capsys, "--target", harness.target, "--since", "5", "--count", "1"
    )
    assert rc == 0
    first = out.splitlines()[0]
    assert first == (
        "resync: --since 5 is ahead of the agent's last cycle (2); showing its current state"
    )


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
async def test_table_mode_prints_the_snapshot_then_only_what_changed(harness: ServerHarness):
    """Not on a terminal: the snapshot as a whole GPU table, then for each cycle that
    changed something its heading and the changed rows only; a cycle that changed
    nothing prints nothing."""
    harness.publish([ok(0), failed(1), ok(2)])
    out, err = io.StringIO(), io.StringIO()
    settings = parsed("--target", harness.target, "--count", "4", "--heartbeat", "60")
    task = asyncio.create_task(watch(settings, out=out, err=err))
    await eventually(lambda: "snapshot" in out.getvalue())
    # One at a time: a cycle sent late carries the readiness of its sending.
    for sent, gpus in enumerate([[ok(0), failed(1), ok(2)], None, None], start=2):
        harness.publish(gpus)  # cycle 2: as before; 3: GPU 1 recovers; 4: as before
        await eventually(lambda sent=sent: harness.publication.messages_sent >= sent)
    async with asyncio.timeout(3):
        assert await task == 0
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("snapshot  node node-under-test")
    assert "NOT READY: cycle-failed" in lines[0]
    assert lines[1].split()[:4] == ["GPU", "HEALTH", "UUID", "OUTCOME"]
    rows = [line.split() for line in lines[2:5]]
    assert [row[:2] for row in rows] == [["0", "healthy"], ["1", "unhealthy"], ["2", "healthy"]]
    assert rows[1][3:5] == ["failed", "write_failed:no_permission"]
    assert lines[5] == ""
    assert lines[6].startswith("cycle 3  ")
    assert "  ENFORCED  " in lines[6]
    assert lines[7].split()[0] == "GPU"
    assert lines[8].split()[:4] == ["1", "healthy", "GPU-…00000001", "enforced"]
    assert lines[9:] == [""]
    assert err.getvalue() == ""


@pytest.mark.asyncio
async def test_not_on_a_terminal_columns_still_fits(
    harness: ServerHarness, capsys, monkeypatch: pytest.MonkeyPatch
):
    """COLUMNS (as a pager or `watch -n` sets it) bounds the lines printed to a pipe."""
    monkeypatch.setenv("COLUMNS", "80")
    harness.publish([ok(0), failed(1), ok(2)])
    rc, out, _ = await capwatch_watch(capsys, "--target", harness.target, "--count", "1")
    assert rc == 0
    assert "write_failed:no_permission" in out
    assert max(len(line) for line in out.splitlines()) <= 80


@pytest.mark.asyncio
async def test_heartbeats_print_only_when_readiness_moves():
    """Not on a terminal, a heartbeat that says what the last message said prints nothing;
    the one that says the agent went stale prints its line (heartbeats at 1 s, the
    least the agent takes; stale after 1.5 s: the first beat is ready, the second stale)."""
    async with running(interval_s=0.5) as harness:
        harness.publish()
        out, err = io.StringIO(), io.StringIO()
        stop = asyncio.Event()
        settings = parsed("--target", harness.target, "--heartbeat", "1")
        task = asyncio.create_task(watch(settings, out=out, err=err, stop=stop))
        await eventually(lambda: "NOT READY: stale" in out.getvalue(), timeout=5)
        stop.set()
        assert await task == 0
    beats = [line for line in out.getvalue().splitlines() if line.startswith("heartbeat")]
    assert len(beats) == 1
    assert "NOT READY: stale" in beats[0]


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
    assert [d["device"]["device_name"] for d in devices] == ["gpu-0", "gpu-1", "gpu-2"]


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
    assert "disconnected: stream ended by the agent; retrying in " in text
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


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_agent_never_reached_is_one_line_and_exit_1(capsys):
    """A watch that never got a message says why on one line and exits 1, rather than
    retrying for ever in silence."""
    target = f"127.0.0.1:{closed_port()}"
    assert main(["watch", "--target", target], {}) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith(f"capwatch watch: cannot reach {target}: UNAVAILABLE")
    assert captured.err.endswith(" (--retry keeps trying)\n")


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["flag", "twin"])
async def test_retry_keeps_trying_an_agent_not_reached_yet(how: str):
    """--retry (or CAPWATCH_WATCH_RETRY=true) keeps trying an agent that is not up yet,
    and shows it once it is."""
    port = closed_port()
    parser = argparse.ArgumentParser()
    add_watch_arguments(parser)
    argv = ["--target", f"127.0.0.1:{port}", "--count", "1"]
    env = {"CAPWATCH_WATCH_RETRY": "true"} if how == "twin" else {}
    settings = watch_settings(
        parser.parse_args([*argv, *(["--retry"] if how == "flag" else [])]), env
    )
    out, err = io.StringIO(), io.StringIO()
    task = asyncio.create_task(watch(settings, out=out, err=err))
    await eventually(lambda: "disconnected: " in out.getvalue(), timeout=5)
    harness = await start_harness(settings=settings_for(f"127.0.0.1:{port}"))
    try:
        harness.publish()
        async with asyncio.timeout(15):
            assert await task == 0
    finally:
        await harness.server.stop()
    assert f"reconnected to 127.0.0.1:{port}" in out.getvalue()
    assert "snapshot  node node-under-test" in out.getvalue()
    assert err.getvalue() == ""


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("gpus", "unknown"), [(["7"], "7"), (["1", "GPU-nope"], "GPU-nope")], ids=["index", "uuid"]
)
async def test_an_unknown_gpu_is_an_error(harness: ServerHarness, gpus: list[str], unknown: str):
    """--gpu naming a GPU the agent does not have exits 2 with one line, instead of an
    empty table for ever; --since (no snapshot first) is checked too."""
    harness.publish()
    harness.publish()
    for since in ("0", "1"):
        argv = ["--target", harness.target, "--since", since, *(f"--gpu={g}" for g in gpus)]
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "capwatch.cli",
            "watch",
            *argv,
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(20):
            out, err = await process.communicate()
        assert (process.returncode, out) == (2, b"")
        expected = f"capwatch watch: error: --gpu: {harness.target} has no GPU {unknown}\n"
        assert err.decode() == expected


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
        "capwatch.cli",
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


@pytest.mark.asyncio
async def test_instance_names_the_agent_instance_since_belongs_to(harness: ServerHarness, capsys):
    """--since N --instance ID resumes only within that agent instance: its own id gets the
    cycles after N, another one's a resync that says the agent restarted."""
    for _ in range(3):
        harness.publish()
    argv = ["--target", harness.target, "--since", "2", "--count", "1", "--json"]
    own = harness.hub.instance_id
    rc, out, _ = await capwatch_watch(capsys, *argv, "--instance", own)
    assert rc == 0
    assert json.loads(out)["cycle"]["sequence"] == "3"
    other = "0badc0de-0000-4000-8000-000000000000"
    rc, out, err = await capwatch_watch(capsys, *argv, "--instance", other)
    assert rc == 0
    assert json.loads(out)["snapshot"]["resync"] is True
    assert err == "resync: the agent restarted; showing its current state\n"


@pytest.mark.asyncio
async def test_an_agent_gone_for_many_retries_is_a_line_per_reason_and_json_stays_json(
    harness: ServerHarness, monkeypatch: pytest.MonkeyPatch
):
    """--json, the agent stopped under the watch and retried many times: stdout keeps only
    the agent's messages, each a JSON object; stderr says why in one short line per
    reason (the stream ended, then the connection refused), not a line of grpc's status
    text per retry."""
    retries: list[Disconnected] = []
    disconnected = Printer.disconnected

    def counted(self: Printer, event: Disconnected) -> None:
        retries.append(event)
        disconnected(self, event)

    monkeypatch.setattr(Printer, "disconnected", counted)
    harness.publish()
    out, err = io.StringIO(), io.StringIO()
    stop = asyncio.Event()
    settings = parsed("--target", harness.target, "--json", "--heartbeat", "60")
    task = asyncio.create_task(watch(settings, out=out, err=err, stop=stop))
    await eventually(lambda: "snapshot" in out.getvalue())
    await harness.server.stop()
    await eventually(lambda: len(retries) >= 4, timeout=20)
    stop.set()
    assert await task == 0
    assert [list(json.loads(line)) for line in out.getvalue().splitlines()] == [["snapshot"]]
    lines = err.getvalue().splitlines()
    assert [line.partition("; retrying in ")[0] for line in lines] == [
        "disconnected: stream ended by the agent",
        "disconnected: connection refused",
    ], lines
    assert all(re.fullmatch(r"disconnected: [a-z ]+; retrying in \d+\.\d+s", x) for x in lines)
