"""Pure domain -> protobuf mappers (server/grpc/mapping.py) and the device table they read."""

from __future__ import annotations

import dataclasses

import pytest

from capwatch.agent.devices import DeviceHealth, device_health, fold, inventory
from capwatch.agent.dra.claims import ClaimRef
from capwatch.agent.dra.slices import DeviceName
from capwatch.agent.gpus import GpuErrorClass
from capwatch.agent.health.faults import Fault, FaultKind
from capwatch.agent.health.telemetry import Readings, ThrottleReason
from capwatch.agent.reports import (
    AbortReason,
    CapSource,
    ClampDirection,
    CycleReport,
    GpuResult,
    Outcome,
    Reason,
    SafeDefaultCause,
)
from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.kit.readiness import Readiness, ReadinessReason
from capwatch.server.grpc import mapping
from tests.server.harness import POD, UUIDS, failed, idle, ok

READY = Readiness(ready=True, reason=ReadinessReason.READY, last_good_age_s=0.5)
STALE = Readiness(ready=False, reason=ReadinessReason.STALE, last_good_age_s=99.0)
FAILED = Readiness(ready=False, reason=ReadinessReason.CYCLE_FAILED, last_good_age_s=3.0)


def report(seq: int, *gpus: GpuResult, wall: float = 1000.0, abort: AbortReason | None = None):
    return CycleReport(
        sequence=seq,
        started_wall=wall - 0.25,
        finished_wall=wall,
        started_monotonic=50.0,
        finished_monotonic=50.25,
        gpus=gpus,
        abort_reason=abort,
    )


def namer(index: int, uuid: str | None) -> str:
    return f"gpu-{index}"


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [(0.0, (0, 0)), (1.5, (1, 500_000_000)), (2.9999999999, (3, 0)), (-1.0, (0, 0))],
)
def test_duration(seconds: float, expected: tuple[int, int]):
    """Ages become non-negative Durations with nanos in range."""
    d = mapping.duration(seconds)
    assert (d.seconds, d.nanos) == expected


def test_timestamp_round_trip():
    """Wall times become Timestamps without losing sub-second precision."""
    ts = mapping.timestamp(1_750_000_000.25)
    assert (ts.seconds, ts.nanos) == (1_750_000_000, 250_000_000)


@pytest.mark.parametrize(
    ("result", "outcome", "health"),
    [
        (ok(0), pb.OUTCOME_ENFORCED, pb.DEVICE_HEALTH_HEALTHY),
        (idle(0), pb.OUTCOME_IDLE, pb.DEVICE_HEALTH_HEALTHY),
        (failed(0), pb.OUTCOME_FAILED, pb.DEVICE_HEALTH_UNHEALTHY),
        (
            GpuResult(
                index=0,
                uuid=UUIDS[0],
                outcome=Outcome.RELEASED,
                reason=Reason.RELEASED,
                message="r",
            ),
            pb.OUTCOME_RELEASED,
            pb.DEVICE_HEALTH_HEALTHY,
        ),
    ],
)
def test_cycle_device_outcome_and_health(result: GpuResult, outcome: int, health: int):
    """Each outcome maps to its enum and to the health a consumer sees."""
    message = mapping.cycle(report(1, result), devices={}, namer=namer, ready=READY, age_s=0.1)
    (device,) = message.devices
    assert (device.outcome, device.health) == (outcome, health)
    assert device.reason == result.reason.value
    assert device.dra_device_name == "gpu-0"


def test_cycle_fields():
    """Every field of a capped GPU reaches the message, optional watts only when known."""
    capped = GpuResult(
        index=1,
        uuid=UUIDS[1],
        outcome=Outcome.ENFORCED,
        reason=Reason.OK,
        message="m",
        owners=(POD,),
        requested_watts=5000,
        resolved_watts=5000,
        applied_watts=700,
        cap_source=CapSource.ANNOTATION,
        clamp=ClampDirection.LOWERED_TO_MAX,
        process_count=2,
    )
    message = mapping.cycle(report(7, capped), devices={}, namer=namer, ready=READY, age_s=0.5)
    device = message.devices[0]
    assert (device.requested_watts, device.resolved_watts, device.applied_watts) == (
        5000,
        5000,
        700,
    )
    assert device.cap_source == pb.CAP_SOURCE_ANNOTATION
    assert device.clamp_direction == pb.CLAMP_DIRECTION_LOWERED_TO_MAX
    assert [(o.namespace, o.name, o.uid) for o in device.owners] == [
        (POD.namespace, POD.name, POD.uid)
    ]
    assert device.process_count == 2
    assert device.sequence == 7
    assert message.enforced
    assert message.abort_reason == pb.ABORT_REASON_NONE
    assert message.readiness.reason == pb.READINESS_REASON_READY
    assert message.readiness.last_cycle_age.ToTimedelta().total_seconds() == pytest.approx(0.5)
    assert message.duration.ToTimedelta().total_seconds() == pytest.approx(0.25)


def test_failed_device_carries_error_class_and_no_applied_watts():
    """A failed write keeps its class and never claims an applied value."""
    message = mapping.cycle(
        report(1, failed(0, GpuErrorClass.GPU_IS_LOST)),
        devices={},
        namer=namer,
        ready=FAILED,
        age_s=0.0,
    )
    device = message.devices[0]
    assert device.error_class == "gpu_is_lost"
    assert not device.HasField("applied_watts")
    assert message.failure_summary == "gpu0:write_failed"


def test_safe_default_cause_maps():
    """The reason a safe default was used reaches the consumer."""
    result = GpuResult(
        index=0,
        uuid=UUIDS[0],
        outcome=Outcome.ENFORCED,
        reason=Reason.OK,
        message="m",
        cap_source=CapSource.SAFE_DEFAULT,
        safe_default_cause=SafeDefaultCause.DISAGREE,
        resolved_watts=300,
        applied_watts=300,
    )
    device = mapping.cycle(
        report(1, result), devices={}, namer=namer, ready=READY, age_s=0
    ).devices[0]
    assert device.safe_default_cause == pb.SAFE_DEFAULT_CAUSE_DISAGREE
    assert not device.HasField("requested_watts")


def test_every_domain_enum_member_has_a_mapping():
    """Adding a domain enum member without a protobuf mapping fails here, not in production."""
    assert set(mapping.OUTCOME) == set(Outcome)
    assert set(mapping.CLAMP_DIRECTION) == set(ClampDirection)
    assert set(mapping.CAP_SOURCE) == {None, *CapSource}
    assert set(mapping.SAFE_DEFAULT_CAUSE) == {None, *SafeDefaultCause}
    assert set(mapping.ABORT_REASON) == {None, *AbortReason}
    assert set(mapping.READINESS_REASON) == set(ReadinessReason)
    assert set(mapping.DEVICE_HEALTH) == set(DeviceHealth)


def test_device_table_transition_moves_only_on_change():
    """last_transition moves when outcome or reason changes; last_update every cycle."""
    table = inventory({0: UUIDS[0]}, wall=10.0)
    table = fold(table, report(1, ok(0, 350), wall=100.0))
    table = fold(table, report(2, ok(0, 400), wall=200.0))
    assert (table[0].last_transition_wall, table[0].last_update_wall) == (100.0, 200.0)
    table = fold(table, report(3, failed(0), wall=300.0))
    assert table[0].last_transition_wall == 300.0
    table = fold(table, report(4, wall=400.0))  # a cycle that did not reach GPU 0
    assert table[0].sequence == 3


@pytest.mark.parametrize(
    ("ready", "abort", "result", "expected"),
    [
        (READY, None, ok(0), DeviceHealth.HEALTHY),
        (FAILED, None, failed(0), DeviceHealth.UNHEALTHY),
        (STALE, None, ok(0), DeviceHealth.UNKNOWN),
        (FAILED, AbortReason.POD_VIEW_NOT_SYNCED, ok(0), DeviceHealth.UNKNOWN),
        (READY, None, None, DeviceHealth.UNKNOWN),
    ],
)
def test_device_health_rule(ready, abort, result, expected):
    """Health is UNKNOWN when stale, aborted or never reported; else the GPU's last step."""
    table = inventory({0: UUIDS[0]}, wall=1.0)
    if result is not None:
        table = fold(table, report(1, result))
    latest = report(2, abort=abort) if abort else None
    assert device_health(table[0], latest=latest, readiness=ready) is expected


def test_snapshot_lists_unreported_devices_and_last_cycle():
    """A snapshot lists every known GPU; one no cycle reached is UNKNOWN/not_reported."""
    table = fold(inventory(dict(enumerate(UUIDS[:2])), wall=1.0), report(1, ok(0)))
    message = mapping.snapshot(
        node_name="n",
        instance_id="i",
        interval_s=15,
        stale_after_s=45,
        sequence=1,
        latest=report(1, ok(0)),
        devices=table,
        namer=namer,
        ready=READY,
        last_cycle_age_s=2.0,
    )
    assert [d.index for d in message.devices] == [0, 1]
    assert message.devices[1].reason == mapping.NOT_REPORTED
    assert message.devices[1].health == pb.DEVICE_HEALTH_UNKNOWN
    assert message.last_cycle.sequence == 1
    assert message.stale_after.seconds == 45
    assert not message.resync


XID = Fault(kind=FaultKind.XID, code=79, first_seen_wall=900.0, last_seen_wall=950.5, count=4)
LOST = Fault(kind=FaultKind.GPU_LOST, code=0, first_seen_wall=960.0, last_seen_wall=990.0, count=3)


@pytest.mark.parametrize(
    ("fault", "kind", "summary"),
    [
        (XID, pb.FAULT_KIND_XID, "XID 79"),
        (LOST, pb.FAULT_KIND_GPU_LOST, "GPU lost"),
        (
            Fault(
                kind=FaultKind.ECC_UNCORRECTED, code=0, first_seen_wall=1, last_seen_wall=2, count=2
            ),
            pb.FAULT_KIND_ECC_UNCORRECTED,
            "uncorrectable ECC errors",
        ),
        (
            Fault(
                kind=FaultKind.ROW_REMAP_FAILURE,
                code=0,
                first_seen_wall=1,
                last_seen_wall=1,
                count=1,
            ),
            pb.FAULT_KIND_ROW_REMAP_FAILURE,
            "row remapping failed",
        ),
    ],
)
def test_fault_maps_kind_code_times_count_and_stable_summary(fault: Fault, kind: int, summary: str):
    """Each fault kind has its enum value; times, count and the summary come across as they are."""
    message = mapping.fault(fault)
    assert (message.kind, message.code, message.count, message.summary) == (
        kind,
        fault.code,
        fault.count,
        summary,
    )
    assert message.first_seen_time.ToNanoseconds() == int(fault.first_seen_wall * 1e9)
    assert message.last_seen_time.ToNanoseconds() == int(fault.last_seen_wall * 1e9)


def test_every_fault_kind_has_a_mapping():
    """A new fault kind without a protobuf value fails here."""
    assert set(mapping.FAULT_KIND) == set(FaultKind)


@pytest.mark.parametrize(
    ("readings", "expected"),
    [
        (Readings(), {}),
        (
            Readings(
                power_draw_milliwatts=251_250,
                enforced_limit_milliwatts=250_000,
                throttle_reasons=(ThrottleReason.HW_SLOWDOWN, ThrottleReason.SW_POWER_CAP),
                ecc_uncorrected_volatile=0,
                row_remap_pending=False,
                row_remap_failure=True,
            ),
            {
                "power_draw_milliwatts": 251_250,
                "enforced_limit_milliwatts": 250_000,
                "throttle_reasons": ["hw_slowdown", "sw_power_cap"],
                "throttle_reasons_available": True,
                "ecc_uncorrected_volatile": 0,
                "row_remap_pending": False,
                "row_remap_failure": True,
            },
        ),
        (
            Readings(throttle_reasons=(), retired_pages_pending=True, failed_reads=("ecc",)),
            {
                "throttle_reasons_available": True,
                "retired_pages_pending": True,
                "failed_reads": ["ecc"],
            },
        ),
        (
            Readings(power_draw_milliwatts=2**40),
            {"power_draw_milliwatts": 2**32 - 1},
        ),
    ],
    ids=["nothing-available", "everything", "older-part", "clamped-not-wrapped"],
)
def test_telemetry_sets_exactly_the_available_reads(readings: Readings, expected: dict):
    """A read that is not available is an absent field (a present 0 is a real zero)."""
    message = mapping.telemetry(readings)
    got = {field.name: value for field, value in message.ListFields()}
    got = {
        k: list(v) if isinstance(v, (list, tuple)) or hasattr(v, "append") else v
        for k, v in got.items()
    }
    assert got == expected


def test_faulted_gpu_is_unhealthy_though_its_cap_was_enforced():
    """A fault makes the GPU UNHEALTHY with its outcome still ENFORCED; telemetry rides along."""
    result = dataclasses.replace(ok(0), faults=(XID,), readings=Readings(power_draw_milliwatts=1))
    device = mapping.cycle(
        report(1, result), devices={}, namer=namer, ready=READY, age_s=0
    ).devices[0]
    assert (device.outcome, device.health) == (pb.OUTCOME_ENFORCED, pb.DEVICE_HEALTH_UNHEALTHY)
    assert [f.summary for f in device.faults] == ["XID 79"]
    assert device.telemetry.power_draw_milliwatts == 1
    assert (
        not mapping.cycle(report(1, ok(0)), devices={}, namer=namer, ready=READY, age_s=0)
        .devices[0]
        .HasField("telemetry")
    )


def test_device_table_transition_moves_when_faults_come_and_go_not_when_counted():
    """A new fault kind or code is a transition; the same fault seen again is not."""
    table = inventory({0: UUIDS[0]}, wall=10.0)
    table = fold(table, report(1, ok(0), wall=100.0))
    table = fold(table, report(2, dataclasses.replace(ok(0), faults=(XID,)), wall=200.0))
    assert table[0].last_transition_wall == 200.0
    again = dataclasses.replace(XID, count=9, last_seen_wall=290.0)
    table = fold(table, report(3, dataclasses.replace(ok(0), faults=(again,)), wall=300.0))
    assert table[0].last_transition_wall == 200.0
    assert device_health(table[0], latest=None, readiness=READY) is DeviceHealth.UNHEALTHY
    table = fold(table, report(4, ok(0), wall=400.0))
    assert table[0].last_transition_wall == 400.0
    assert device_health(table[0], latest=None, readiness=READY) is DeviceHealth.HEALTHY


def test_a_claims_cap_names_its_claims_and_the_drivers_pool_and_device():
    """A cap from DRA claims maps to CAP_SOURCE_CLAIM with each claim's namespace, name
    and uid, and the GPU is named by its ResourceSlice's driver, pool and device; a GPU no
    slice names keeps the template's name and no pool or driver of its own."""
    result = dataclasses.replace(
        ok(1, 450),
        cap_source=CapSource.CLAIM,
        claims=(ClaimRef(namespace="ml", name="train", uid="c-1"),),
        dra_device=DeviceName(driver="gpu.nvidia.com", pool="node-a", device="gpu-7"),
    )
    message = mapping.settled(result, "ignored", DeviceHealth.HEALTHY, 0.0)
    assert message.cap_source == pb.CAP_SOURCE_CLAIM
    assert [(c.namespace, c.name, c.uid) for c in message.claims] == [("ml", "train", "c-1")]
    assert (message.dra_driver_name, message.dra_pool_name) == ("gpu.nvidia.com", "node-a")

    def template(index: int, uuid: str | None) -> str:
        return f"gpu-{index}"

    assert mapping.dra_device_name(result, 1, UUIDS[1], template) == "gpu-7"
    assert mapping.dra_pool_name(result, "default-pool") == "node-a"
    plain = ok(1, 450)
    assert mapping.dra_device_name(plain, 1, UUIDS[1], template) == "gpu-1"
    assert mapping.dra_pool_name(plain, "default-pool") == "default-pool"
    unnamed = mapping.settled(plain, "gpu-1", DeviceHealth.HEALTHY, 0.0)
    assert (unnamed.dra_driver_name, unnamed.dra_pool_name) == ("", "")
