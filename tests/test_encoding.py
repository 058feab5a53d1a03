"""Watch's cycle messages encoded once per cycle (server/grpc/encoding.py).

The reference is the plain mapper: serializing ``mapping.cycle``'s message
with the same readiness must give exactly the encoder's bytes.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capwatch.agent.devices import DeviceState, fold, inventory
from capwatch.agent.dra.claims import ClaimRef
from capwatch.agent.dra.slices import DeviceName
from capwatch.agent.gpus import GpuErrorClass
from capwatch.agent.health.faults import Fault, FaultKind
from capwatch.agent.health.telemetry import Readings, ThrottleReason
from capwatch.agent.pods import PodRef
from capwatch.agent.reports import (
    AbortReason,
    CapSource,
    ClampDirection,
    CycleFailure,
    CycleFailureKind,
    CycleReport,
    GpuResult,
    Outcome,
    Reason,
    SafeDefaultCause,
)
from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.kit.readiness import Readiness, ReadinessReason
from capwatch.server.grpc import encoding, mapping
from tests.server.harness import POD, UUIDS, failed, idle, ok

READY = Readiness(ready=True, reason=ReadinessReason.READY, last_good_age_s=0.5)
STALE = Readiness(ready=False, reason=ReadinessReason.STALE, last_good_age_s=99.0)
FAILED = Readiness(
    ready=False, reason=ReadinessReason.CYCLE_FAILED, detail="gpu1:write_failed", last_good_age_s=3
)
NO_CYCLE = Readiness(ready=False, reason=ReadinessReason.NO_CYCLE_YET, last_good_age_s=None)


XID_79 = Fault(
    kind=FaultKind.XID, code=79, first_seen_wall=1_750_000_000.5, last_seen_wall=1.75e9, count=3
)
FAULTED = dataclasses.replace(
    ok(0),
    faults=(XID_79,),
    readings=Readings(
        power_draw_milliwatts=251_000,
        enforced_limit_milliwatts=250_000,
        throttle_reasons=(ThrottleReason.SW_POWER_CAP,),
        ecc_uncorrected_volatile=0,
        row_remap_failure=False,
        failed_reads=("row_remap",),
    ),
)

CLAIMED = dataclasses.replace(
    ok(1),
    cap_source=CapSource.CLAIM,
    claims=(ClaimRef(namespace="ml", name="train", uid="c-1"), ClaimRef(namespace="ml", name="b")),
    dra_device=DeviceName(driver="gpu.nvidia.com", pool="node-a", device="gpu-1"),
)


OBSERVED = dataclasses.replace(
    ok(2),
    outcome=Outcome.OBSERVED,
    reason=Reason.OBSERVED,
    applied_watts=None,
    intended_watts=250,
)


def namer(index: int, uuid: str | None) -> str:
    return f"gpu-{index}"


def report(
    seq: int,
    *gpus: GpuResult,
    wall: float = 1_750_000_000.125,
    abort: AbortReason | None = None,
    failures: tuple[CycleFailure, ...] = (),
    interrupted: bool = False,
    observe: bool = False,
) -> CycleReport:
    return CycleReport(
        sequence=seq,
        started_wall=wall - 0.25,
        finished_wall=wall,
        started_monotonic=50.0,
        finished_monotonic=50.25,
        gpus=gpus,
        abort_reason=abort,
        failures=failures,
        interrupted=interrupted,
        observe=observe,
    )


def both(
    cycle: CycleReport,
    *,
    devices: dict[int, DeviceState] | None = None,
    ready: Readiness = READY,
    age_s: float = 0.75,
    include=None,
) -> tuple[bytes, bytes]:
    """(the encoder's bytes, the reference mapper's serialized message)."""
    table = fold(devices or {}, cycle) if devices is not None else {}
    expected = pb.WatchResponse(
        cycle=mapping.cycle(
            cycle, devices=table, namer=namer, ready=ready, age_s=age_s, include=include
        )
    ).SerializeToString()
    encoded = encoding.encode_cycle(
        cycle, devices=table, namer=namer, ready=ready, include=include
    ).watch_response(encoding.encode_readiness(ready, last_cycle_age_s=age_s))
    return encoded, expected


HUGE = GpuResult(
    index=2,
    uuid=None,
    outcome=Outcome.ENFORCED,
    reason=Reason.OK,
    message="ü" * 3000,  # a device over 16 KiB: a three-byte length
    owners=tuple(PodRef(namespace="ns", name=f"p{i}", uid=f"u{i}") for i in range(900)),
    requested_watts=0,
    cap_source=CapSource.SAFE_DEFAULT,
    safe_default_cause=SafeDefaultCause.NO_POD,
    clamp=ClampDirection.RAISED_TO_MIN,
    process_count=300,
)


@pytest.mark.parametrize(
    ("cycle", "ready", "table"),
    [
        pytest.param(report(1, ok(0), idle(1), failed(2)), READY, None, id="three-outcomes"),
        pytest.param(report(7, ok(0), failed(1)), FAILED, {}, id="failed-with-table"),
        pytest.param(report(2, ok(0)), STALE, {}, id="stale-health-unknown"),
        pytest.param(report(3, ok(0)), NO_CYCLE, None, id="no-cycle-yet"),
        pytest.param(
            report(
                4,
                abort=AbortReason.POD_VIEW_NOT_SYNCED,
                failures=(CycleFailure(kind=CycleFailureKind.POD_VIEW_NOT_SYNCED, message="x"),),
            ),
            FAILED,
            {},
            id="aborted-no-gpus",
        ),
        pytest.param(
            report(
                5,
                failed(0, GpuErrorClass.GPU_IS_LOST),
                failures=(
                    CycleFailure(kind=CycleFailureKind.DEVICE_COUNT_FAILED, message="count"),
                    CycleFailure(kind=CycleFailureKind.INTERNAL_ERROR, message="é"),
                ),
                interrupted=True,
            ),
            FAILED,
            {},
            id="interrupted-with-failures",
        ),
        pytest.param(report(0, wall=0.0), NO_CYCLE, None, id="all-zero"),
        pytest.param(report(2**14 + 1, ok(1), wall=0.5), READY, {}, id="multi-byte-sequence"),
        pytest.param(report(2**63, ok(0)), READY, None, id="largest-sequences"),
        pytest.param(report(9, HUGE), READY, {}, id="device-over-16-KiB"),
        pytest.param(report(4, FAULTED, idle(1)), READY, {}, id="faults-and-telemetry"),
        pytest.param(report(6, CLAIMED, FAULTED), READY, {}, id="claims-and-driver-names"),
        pytest.param(report(8, OBSERVED, observe=True), READY, {}, id="observe-mode"),
    ],
)
def test_encoded_cycle_is_the_mapped_message_byte_for_byte(cycle, ready, table):
    """Every kind of cycle encodes to exactly the reference mapper's serialization."""
    encoded, expected = both(cycle, devices=table, ready=ready)
    assert encoded == expected
    assert pb.WatchResponse.FromString(encoded) == pb.WatchResponse.FromString(expected)


def test_transition_times_come_from_the_device_table():
    """A GPU whose outcome did not change keeps its earlier transition time when encoded."""
    table = fold(inventory({0: UUIDS[0]}, wall=1.0), report(1, ok(0), wall=100.0))
    cycle = report(2, ok(0, 400), wall=200.0)
    encoded, expected = both(cycle, devices=table)
    assert encoded == expected
    device = pb.WatchResponse.FromString(encoded).cycle.devices[0]
    assert device.last_transition_time.seconds == 100
    assert device.last_update_time.seconds == 200


def test_a_filter_leaves_out_devices():
    """Only the devices the filter admits are encoded."""
    cycle = report(1, ok(0), idle(1), failed(2))
    encoded, expected = both(cycle, include=lambda index, uuid: index != 1)
    assert encoded == expected
    assert [d.index for d in pb.WatchResponse.FromString(encoded).cycle.devices] == [0, 2]


def test_readiness_is_the_only_part_that_changes_per_send():
    """One encoded cycle, two sends: each carries its own readiness and the same rest."""
    cycle = encoding.encode_cycle(report(1, ok(0)), devices={}, namer=namer, ready=READY)
    early = pb.WatchResponse.FromString(
        cycle.watch_response(encoding.encode_readiness(READY, last_cycle_age_s=0.1))
    )
    late = pb.WatchResponse.FromString(
        cycle.watch_response(encoding.encode_readiness(READY, last_cycle_age_s=9.0))
    )
    assert early.cycle.readiness.last_cycle_age.seconds == 0
    assert late.cycle.readiness.last_cycle_age.seconds == 9
    early.cycle.ClearField("readiness")
    late.cycle.ClearField("readiness")
    assert early == late


@pytest.mark.parametrize("ready", [READY, STALE, FAILED, NO_CYCLE])
@pytest.mark.parametrize("age_s", [None, 0.0, 0.5, 2.9999999999, 86400.25, -1.0])
def test_readiness_is_the_mapped_message_byte_for_byte(ready: Readiness, age_s: float | None):
    """Each send's readiness encodes to exactly the reference mapper's serialization."""
    expected = mapping.readiness(ready, last_cycle_age_s=age_s).SerializeToString()
    assert encoding.encode_readiness(ready, last_cycle_age_s=age_s) == expected


@pytest.mark.parametrize(
    "wall", [0.0, 0.5, 1_750_000_000.999999999, 4e9, -0.25, -1_000_000.5, -1e-12]
)
def test_timestamps_before_and_after_1970(wall: float):
    """Wall times encode as protobuf does, negative seconds (before 1970) included."""
    assert encoding.encode_timestamp(wall) == mapping.timestamp(wall).SerializeToString()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, b"\x00"),
        (1, b"\x01"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (300, b"\xac\x02"),
        (16383, b"\xff\x7f"),
        (16384, b"\x80\x80\x01"),
        (2**64 - 1, b"\xff" * 9 + b"\x01"),
    ],
)
def test_varint(value: int, expected: bytes):
    """Varints are protobuf's base-128 encoding, least significant group first."""
    assert encoding.varint(value) == expected


@pytest.mark.parametrize("value", [-1, 2**64])
def test_varint_refuses_what_protobuf_cannot_carry(value: int):
    """Out-of-range values are a programming error, not a silently wrong message."""
    with pytest.raises(ValueError, match="out of range"):
        encoding.varint(value)


results = st.builds(
    GpuResult,
    index=st.integers(0, 15),
    uuid=st.one_of(st.none(), st.sampled_from(UUIDS)),
    outcome=st.sampled_from(Outcome),
    reason=st.sampled_from(Reason),
    message=st.text(max_size=300),
    owners=st.lists(st.just(POD), max_size=3).map(tuple),
    error_class=st.one_of(st.none(), st.sampled_from(GpuErrorClass)),
    requested_watts=st.one_of(st.none(), st.integers(0, 2**32 - 1)),
    resolved_watts=st.one_of(st.none(), st.integers(0, 2**32 - 1)),
    applied_watts=st.one_of(st.none(), st.integers(0, 2**32 - 1)),
    intended_watts=st.one_of(st.none(), st.integers(0, 2**32 - 1)),
    cap_source=st.one_of(st.none(), st.sampled_from(CapSource)),
    safe_default_cause=st.one_of(st.none(), st.sampled_from(SafeDefaultCause)),
    clamp=st.sampled_from(ClampDirection),
    process_count=st.integers(0, 2**32 - 1),
    claims=st.lists(
        st.builds(ClaimRef, namespace=st.text(max_size=20), name=st.text(max_size=40)),
        max_size=3,
    ).map(tuple),
    dra_device=st.one_of(
        st.none(),
        st.builds(
            DeviceName,
            driver=st.just("gpu.nvidia.com"),
            pool=st.text(max_size=30),
            device=st.text(min_size=1, max_size=20),
        ),
    ),
    faults=st.lists(
        st.builds(
            Fault,
            kind=st.sampled_from(FaultKind),
            code=st.integers(0, 2**32 - 1),
            first_seen_wall=st.floats(-1e10, 4e9, allow_nan=False),
            last_seen_wall=st.floats(-1e10, 4e9, allow_nan=False),
            count=st.integers(0, 2**64 - 1),
        ),
        max_size=3,
    ).map(tuple),
    readings=st.one_of(
        st.none(),
        st.builds(
            Readings,
            power_draw_milliwatts=st.one_of(st.none(), st.integers(0, 2**32 - 1)),
            enforced_limit_milliwatts=st.one_of(st.none(), st.integers(0, 2**32 - 1)),
            throttle_reasons=st.one_of(
                st.none(), st.lists(st.sampled_from(ThrottleReason), unique=True).map(tuple)
            ),
            ecc_uncorrected_volatile=st.one_of(st.none(), st.integers(0, 2**64 - 1)),
            row_remap_pending=st.one_of(st.none(), st.booleans()),
            row_remap_failure=st.one_of(st.none(), st.booleans()),
            retired_pages_pending=st.one_of(st.none(), st.booleans()),
            failed_reads=st.lists(st.sampled_from(("power_draw", "ecc")), unique=True).map(tuple),
            lost=st.booleans(),
        ),
    ),
)


readiness = st.builds(
    Readiness,
    ready=st.booleans(),
    reason=st.sampled_from(ReadinessReason),
    last_good_age_s=st.one_of(st.none(), st.floats(-5, 1e7, allow_nan=False)),
    detail=st.text(max_size=200),
)


@settings(max_examples=150, deadline=None)
@given(
    gpus=st.lists(results, max_size=8, unique_by=lambda r: r.index),
    sequence=st.integers(0, 2**64 - 1),
    wall=st.floats(-1e10, 4e9, allow_nan=False),
    ready=readiness,
    abort=st.one_of(st.none(), st.sampled_from(AbortReason)),
    interrupted=st.booleans(),
    observe=st.booleans(),
    with_table=st.booleans(),
    age_s=st.floats(-1, 1e7, allow_nan=False),
)
def test_any_cycle_encodes_to_the_mapped_message(
    gpus, sequence, wall, ready, abort, interrupted, observe, with_table, age_s
):
    """Whatever the cycle and readiness, the encoder and the reference mapper agree."""
    cycle = report(
        sequence, *gpus, wall=wall, abort=abort, interrupted=interrupted, observe=observe
    )
    encoded, expected = both(cycle, devices={} if with_table else None, ready=ready, age_s=age_s)
    assert encoded == expected


def test_results_that_hash_alike_are_still_told_apart():
    """The per-GPU cache hashes few fields: results differing elsewhere get their own bytes."""
    base = ok(0)
    others = [
        dataclasses.replace(base, outcome=Outcome.FAILED, reason=Reason.WRITE_FAILED),
        dataclasses.replace(base, cap_source=CapSource.AGREED),
        dataclasses.replace(base, process_count=7),
        dataclasses.replace(base, owners=()),
        dataclasses.replace(base, readings=Readings(ecc_uncorrected_volatile=3)),
        dataclasses.replace(base, readings=Readings(ecc_uncorrected_volatile=4)),
    ]
    for other in others:
        assert hash(other) == hash(base)
        assert other != base
    for result in (base, *others, base):
        encoded, expected = both(report(1, result))
        assert encoded == expected


@pytest.mark.parametrize("ready", [READY, STALE, FAILED, NO_CYCLE])
@pytest.mark.parametrize("age_s", [0.0, 0.01, 2.9999999999, 86400.25])
def test_a_verdict_encoded_once_takes_each_cycles_age_after_it(ready: Readiness, age_s: float):
    """The cycle's own age is readiness's last field: a verdict encoded without it, then
    the age alone, is the whole readiness (how one verdict serves many cycles)."""
    shared = encoding.encode_readiness(ready, last_cycle_age_s=None)
    assert shared + encoding.encode_last_cycle_age(age_s) == encoding.encode_readiness(
        ready, last_cycle_age_s=age_s
    )


def test_one_gpu_in_cycles_whose_per_cycle_fields_change_size():
    """The same GPU's cached bytes serve cycles whose sequence and update time take more or
    fewer bytes (its length prefix changes with them), each exactly as the mapper's."""
    table: dict[int, DeviceState] = {}
    for seq, wall in [(127, 5.0), (128, 5.0), (2**14, 5.0), (1, 5.0), (127, 5.5), (2**21, 5.5)]:
        cycle = report(seq, ok(0), wall=wall)
        encoded, expected = both(cycle, devices=table)
        assert encoded == expected, (seq, wall)
