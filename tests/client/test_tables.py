"""The watch tables, rendered from capwatch.v1 and DRA messages."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.api.gen.v1 import dra_health_pb2 as v1_pb
from capwatch.kit.readiness import ReadinessReason
from capwatch.server.grpc.mapping import READINESS_REASON
from capwatch.watch.layout import FAILED, Line, fit, plain
from capwatch.watch.tables import (
    GPU_COLUMNS,
    cycle_heading,
    dra_lines,
    gpu_styles,
    gpu_table,
    heartbeat_lines,
    readiness_segments,
    snapshot_heading,
)

# What the boards draw, as the plain text a pipe gets.


def text(lines: Iterable[Line]) -> str:
    return "\n".join(plain(line) for line in lines)


def render_cycle(cycle: pb.CycleReport, width: int | None = None) -> str:
    return text([*cycle_heading(cycle, width), *gpu_table(cycle.devices, width)])


def render_snapshot(snapshot: pb.NodeSnapshot, width: int | None = None) -> str:
    return text([*snapshot_heading(snapshot, width), *gpu_table(snapshot.devices, width)])


def render_heartbeat(heartbeat: pb.Heartbeat, width: int | None = None) -> str:
    return text(heartbeat_lines(heartbeat, width))


def render_readiness(readiness: pb.Readiness) -> str:
    return plain(readiness_segments(readiness))


def render_devices(response: Any, *, version: str, width: int | None = None) -> str:
    return text(dra_lines(response, version, width))


def _rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()[1:]]


def test_cycle_table_shows_what_each_gpu_got():
    """Clamps, safe-default causes, error classes and uid-only owners all reach the row."""
    cycle = pb.CycleReport(
        sequence=7,
        enforced=False,
        abort_reason=pb.ABORT_REASON_NONE,
        failures=[pb.CycleFailure(kind="internal_error", message="boom")],
        readiness=pb.Readiness(
            ready=False, reason=pb.READINESS_REASON_CYCLE_FAILED, detail="gpu1:write_failed"
        ),
        devices=[
            pb.DeviceStatus(
                index=0,
                uuid="GPU-5e5e5e5e-0000-4000-8000-000000000000",
                health=pb.DEVICE_HEALTH_HEALTHY,
                outcome=pb.OUTCOME_ENFORCED,
                reason="ok",
                owners=[pb.PodRef(namespace="ml", name="a")],
                requested_watts=900,
                resolved_watts=900,
                applied_watts=700,
                cap_source=pb.CAP_SOURCE_SAFE_DEFAULT,
                safe_default_cause=pb.SAFE_DEFAULT_CAUSE_DISAGREE,
                clamp_direction=pb.CLAMP_DIRECTION_LOWERED_TO_MAX,
            ),
            pb.DeviceStatus(
                index=1,
                uuid="GPU-1",
                health=pb.DEVICE_HEALTH_UNHEALTHY,
                outcome=pb.OUTCOME_FAILED,
                reason="write_failed",
                error_class="no_permission",
                owners=[pb.PodRef(uid="0123456789abcdef")],
            ),
        ],
    )
    text = render_cycle(cycle)
    head = text.splitlines()[0]
    assert head.startswith("cycle 7  --:--:--  NOT ENFORCED")
    assert "NOT READY: cycle-failed (gpu1:write_failed), no good cycle yet" in head
    assert text.splitlines()[1] == "  ! boom"
    header, first, second = _rows(text.split("\n", 1)[1])
    assert header[:4] == ["GPU", "HEALTH", "UUID", "OUTCOME"]
    assert first == [
        "0",
        "healthy",
        "GPU-…00000000",
        "enforced",
        "ok",
        "ml/a",
        "900",
        "900",
        "700",
        "W",
        "(max)",
        "safe_default/disagree",
        "-",
    ]
    assert second == [
        "1",
        "unhealthy",
        "GPU-1",
        "failed",
        "write_failed:no_permission",
        "uid:01234567",
        "-",
        "-",
        "-",
        "-",
        "-",
    ]


def test_a_faulted_gpu_shows_its_faults_and_power():
    """A GPU's active faults are in its REASON, first, at every width (HEALTH is among the
    first columns left out, and a faulted GPU's reason may be "ok"), and the reason is
    red; POWER is the draw in watts, marked * while the power cap holds the clocks back."""
    device = pb.DeviceStatus(
        index=0,
        health=pb.DEVICE_HEALTH_UNHEALTHY,
        outcome=pb.OUTCOME_ENFORCED,
        reason="ok",
        faults=[pb.DeviceFault(summary="XID 79"), pb.DeviceFault(summary="GPU lost")],
        telemetry=pb.DeviceTelemetry(
            power_draw_milliwatts=250_400, throttle_reasons=["sw_power_cap"]
        ),
    )
    for width in (80, 120, None):
        lines = [plain(line) for line in gpu_table([device], width)]
        assert "fault: XID 79, GPU lost; ok" in lines[1], (width, lines)
    assert "fault: XID" in [plain(line) for line in gpu_table([device], 40)][1]
    assert gpu_styles(device)[4] == FAILED
    wide = [plain(line) for line in gpu_table([device], None)]
    assert wide[1].rstrip().endswith("250 W*")
    device.ClearField("telemetry")
    device.ClearField("faults")
    assert [plain(line) for line in gpu_table([device], None)][1].split()[-1] == "-"
    assert gpu_styles(device)[4] == ""


def test_a_claims_cap_names_its_claims_in_source():
    """SOURCE says a cap came from DRA claims and names them (namespace/name), and a claim
    whose PowerCap was invalid is named beside the safe default it caused."""
    claimed = pb.DeviceStatus(
        index=0,
        outcome=pb.OUTCOME_ENFORCED,
        reason="ok",
        applied_watts=450,
        cap_source=pb.CAP_SOURCE_CLAIM,
        claims=[pb.ClaimRef(namespace="ml", name="train-gpu", uid="u")],
    )
    invalid = pb.DeviceStatus(
        index=1,
        outcome=pb.OUTCOME_ENFORCED,
        reason="ok",
        applied_watts=300,
        cap_source=pb.CAP_SOURCE_SAFE_DEFAULT,
        safe_default_cause=pb.SAFE_DEFAULT_CAUSE_INVALID,
        claims=[pb.ClaimRef(namespace="ml", name="bad")],
    )
    lines = [plain(line) for line in gpu_table([claimed, invalid], None)]
    assert "claim ml/train-gpu" in lines[1]
    assert "safe_default/invalid ml/bad" in lines[2]


@pytest.mark.parametrize("width", [80, 120, 132, 160])
def test_a_lost_gpus_fault_is_never_cut_from_its_reason(width: int):
    """The demo's key moment: a lost GPU's reason (``uuid_read_failed:gpu_is_lost``) is
    longer than REASON at 80 and 120 columns; the fault it has (``fault: GPU lost``)
    comes first, so what is cut is the reason after it, never the fault."""
    lost = pb.DeviceStatus(
        index=4,
        outcome=pb.OUTCOME_FAILED,
        reason="uuid_read_failed",
        error_class="gpu_is_lost",
        faults=[pb.DeviceFault(kind=pb.FAULT_KIND_GPU_LOST, summary="GPU lost")],
    )
    row = plain(gpu_table([_device(0, owners=3), lost], width)[2])
    assert "fault: GPU lost; uuid_read_" in row, row
    assert len(row) <= width


def test_reason_takes_spare_width_before_owners():
    """Past the columns' narrowest, REASON grows first (a failure's reason whole), then
    OWNERS (pod names, cut with an ellipsis anyway)."""
    widths = {c.name: w for c, w in zip(GPU_COLUMNS, fit(GPU_COLUMNS, 132), strict=True)}
    reason, owners = next(c for c in GPU_COLUMNS if c.name == "REASON"), widths["OWNERS"]
    assert widths["REASON"] > reason.min
    assert owners == next(c for c in GPU_COLUMNS if c.name == "OWNERS").min


def test_snapshot_heartbeat_and_unknown_values():
    """A snapshot says resync; a heartbeat is one line; enum values from a newer agent show raw."""
    snapshot = pb.NodeSnapshot(
        node_name="n1",
        agent_instance_id="0123456789",
        sequence=4,
        resync=True,
        readiness=pb.Readiness(ready=True, reason=pb.READINESS_REASON_READY),
        devices=[pb.DeviceStatus(index=0, health=99, reason="not_reported")],  # type: ignore[arg-type]
    )
    snapshot.readiness.last_good_cycle_age.FromSeconds(2)
    text = render_snapshot(snapshot)
    assert text.splitlines()[0].startswith("snapshot (resync)  node n1  agent 01234567  cycle 4")
    assert "ready, last good cycle 2.0s ago" in text.splitlines()[0]
    assert _rows(text)[1][:5] == ["0", "99", "?", "-", "not_reported"]
    beat = render_heartbeat(pb.Heartbeat(last_sequence=4, readiness=snapshot.readiness))
    assert beat == "heartbeat  --:--:--  cycle 4  ready, last good cycle 2.0s ago"


def test_dra_device_list_table():
    """Each DRA device is a row: pool, name, health, timeout and the stable message."""
    response = v1_pb.NodeWatchResourcesResponse(
        devices=[
            v1_pb.DeviceHealth(
                device=v1_pb.DeviceIdentifier(pool_name="n1", device_name="gpu-0"),
                health=v1_pb.UNHEALTHY,
                health_check_timeout_seconds=45,
                message="capwatch: power cap not enforced (write_failed)",
            )
        ]
    )
    lines = render_devices(response, version="v1").splitlines()
    assert lines[0] == "DRA v1 device list  1 devices"
    assert lines[1].split() == ["POOL", "DEVICE", "HEALTH", "UPDATED", "TIMEOUT", "MESSAGE"]
    row = lines[2].split()
    assert row[:3] == ["n1", "gpu-0", "unhealthy"]
    assert row[4] == "45s"
    assert lines[2].endswith("capwatch: power cap not enforced (write_failed)")


@pytest.mark.parametrize(
    "reason",
    [
        r
        for r in ReadinessReason
        if r is not ReadinessReason.READY and READINESS_REASON[r] != pb.READINESS_REASON_UNSPECIFIED
    ],
)
def test_readiness_reasons_are_spelled_as_the_agent_spells_them(reason: ReadinessReason):
    """The table's NOT READY reason is the agent's own value (cycle-failed, not
    cycle_failed), as the shim's /readyz body and the agent's logs spell it."""
    text = render_readiness(pb.Readiness(ready=False, reason=READINESS_REASON[reason]))
    assert text.startswith(f"NOT READY: {reason.value}, ")


def _device(index: int, *, failed: bool = False, owners: int = 1) -> pb.DeviceStatus:
    return pb.DeviceStatus(
        index=index,
        uuid=f"GPU-d0000000-0000-4000-8000-00000000000{index}",
        health=pb.DEVICE_HEALTH_UNHEALTHY if failed else pb.DEVICE_HEALTH_HEALTHY,
        outcome=pb.OUTCOME_FAILED if failed else pb.OUTCOME_ENFORCED,
        reason="identity_unconfirmed" if failed else "ok",
        error_class="gpu_is_lost" if failed else "",
        owners=[pb.PodRef(namespace="inference", name=f"server-{n}") for n in range(owners)],
        requested_watts=350,
        resolved_watts=350,
        applied_watts=350,
        cap_source=pb.CAP_SOURCE_AGREED,
    )


@pytest.mark.parametrize("width", [40, 60, 80, 100, 120, 132, 160, 200])
def test_gpu_table_fits_its_width_and_keeps_what_matters(width: int):
    """At any width every line fits; GPU, OUTCOME, REASON and OWNERS are always shown
    (owners cut with an ellipsis), and the other columns join as room allows."""
    devices = [_device(0, owners=5), _device(1, failed=True)]
    lines = [plain(line) for line in gpu_table(devices, width)]
    assert max(len(line) for line in lines) <= width
    header = lines[0].split()
    assert header[:1] == ["GPU"]
    assert {"OUTCOME", "REASON", "OWNERS"} <= set(header)
    assert "…" in lines[1]  # five owners never fit
    if width >= 80:
        assert "identity_unconfirmed:gpu_is_lost" in lines[2]
    if width >= 200:
        assert header == [c for name in (c.name for c in GPU_COLUMNS) for c in name.split()]


@pytest.mark.parametrize("width", [80, 120, None])
def test_columns_do_not_move_when_a_cycle_fails(width: int | None):
    """Column positions depend on the width alone: a failing GPU's longer reason does not
    push the columns after it (the table does not jump from one cycle to the next)."""
    good = [plain(line) for line in gpu_table([_device(0), _device(1)], width)]
    bad = [plain(line) for line in gpu_table([_device(0), _device(1, failed=True)], width)]
    assert good[0] == bad[0]
    assert [_starts(line) for line in good[:2]] == [_starts(line) for line in bad[:2]]


def _starts(line: str) -> list[int]:
    return [i for i, c in enumerate(line) if c != " " and (i == 0 or line[i - 1] == " ")]


def test_no_width_shows_every_column_at_its_widest():
    """Without a terminal (no width) nothing is dropped or cut: logs keep everything."""
    assert fit(GPU_COLUMNS, None) == [c.max for c in GPU_COLUMNS]
    row = plain(gpu_table([_device(0, owners=2)], None)[1])
    assert "inference/server-0,inference/server-1" in row
