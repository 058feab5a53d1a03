"""Watch's cycle messages as wire bytes: encoded once per cycle, spliced per send.

Every subscriber sent a cycle gets the same header and devices; only the
readiness differs between sends (its ages are measured at send time). So the
shared part is encoded once, each GPU's unchanging part once for as long as it
stays the same, and a send only serializes its readiness and joins bytes:
mapping, copying and serializing a whole message per send cost the stream
more than grpc's own work did. (:mod:`capwatch.server.grpc.cycle_feed` goes further: the
streams sending a cycle within a few milliseconds share one readiness, so one
message.)

The result is byte-for-byte what serializing :func:`capwatch.server.grpc.mapping.cycle`'s
message gives (the tests hold the two together): fields in number order, as
protobuf's serializers write them. Only the framing (tags and lengths of
length-delimited fields) is written by hand; every field's content comes from
the generated classes.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

from capwatch.agent.devices import DeviceHealth, DeviceState
from capwatch.agent.reports import CycleReport, GpuResult
from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.kit.readiness import Readiness
from capwatch.server.grpc.mapping import (
    ABORT_REASON,
    READINESS_REASON,
    DeviceNamer,
    Include,
    cycle_devices,
    dra_device_name,
    duration_parts,
    settled,
    timestamp,
    timestamp_parts,
)

_VARINT = 0
_LEN = 2
_SMALL = tuple(bytes((i,)) for i in range(0x80))


def varint(value: int) -> bytes:
    """Base-128 varint of a non-negative integer below 2**64."""
    if 0 <= value < 0x80:  # tags and short lengths: no loop, no allocation
        return _SMALL[value]
    if 0 < value < 0x4000:  # a device's length
        return bytes((value & 0x7F | 0x80, value >> 7))
    if 0 < value < 1 << 35:  # sequences, and a timestamp's seconds and nanos: no loop
        if value < 1 << 21:
            return bytes((value & 0x7F | 0x80, value >> 7 & 0x7F | 0x80, value >> 14))
        if value < 1 << 28:
            return (
                bytes((value & 0x7F | 0x80, value >> 7 & 0x7F | 0x80, value >> 14 & 0x7F | 0x80))
                + _SMALL[value >> 21]
            )
        return bytes(
            (
                value & 0x7F | 0x80,
                value >> 7 & 0x7F | 0x80,
                value >> 14 & 0x7F | 0x80,
                value >> 21 & 0x7F | 0x80,
                value >> 28,
            )
        )
    if not 0 <= value < 1 << 64:
        raise ValueError(f"varint out of range: {value}")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def length_delimited(field: bytes, payload: bytes) -> bytes:
    """A message, string or bytes ``payload`` under ``field`` (a length-delimited tag)."""
    return field + varint(len(payload)) + payload


def unsigned(field: bytes, value: int) -> bytes:
    """A proto3 unsigned integer or bool without presence under ``field``: nothing when zero."""
    return field + varint(value) if value else b""


# Tags, from proto/capwatch/v1/node_health.proto's field numbers.
_WATCH_CYCLE = tag(pb.WatchResponse.CYCLE_FIELD_NUMBER, _LEN)
_CYCLE_SEQUENCE = tag(pb.CycleReport.SEQUENCE_FIELD_NUMBER, _VARINT)
_CYCLE_STARTED = tag(pb.CycleReport.STARTED_FIELD_NUMBER, _LEN)
_CYCLE_FINISHED = tag(pb.CycleReport.FINISHED_FIELD_NUMBER, _LEN)
_CYCLE_DURATION = tag(pb.CycleReport.DURATION_FIELD_NUMBER, _LEN)
_CYCLE_ENFORCED = tag(pb.CycleReport.ENFORCED_FIELD_NUMBER, _VARINT)
_CYCLE_ABORT_REASON = tag(pb.CycleReport.ABORT_REASON_FIELD_NUMBER, _VARINT)
_CYCLE_FAILURES = tag(pb.CycleReport.FAILURES_FIELD_NUMBER, _LEN)
_CYCLE_DEVICES = tag(pb.CycleReport.DEVICES_FIELD_NUMBER, _LEN)
_CYCLE_READINESS = tag(pb.CycleReport.READINESS_FIELD_NUMBER, _LEN)
_CYCLE_INTERRUPTED = tag(pb.CycleReport.INTERRUPTED_FIELD_NUMBER, _VARINT)
_CYCLE_FAILURE_SUMMARY = tag(pb.CycleReport.FAILURE_SUMMARY_FIELD_NUMBER, _LEN)
_CYCLE_OBSERVE = tag(pb.CycleReport.OBSERVE_FIELD_NUMBER, _VARINT)
_DEVICE_LAST_UPDATE = tag(pb.DeviceStatus.LAST_UPDATE_TIME_FIELD_NUMBER, _LEN)
_DEVICE_PROCESS_COUNT = tag(pb.DeviceStatus.PROCESS_COUNT_FIELD_NUMBER, _VARINT)
_DEVICE_SEQUENCE = tag(pb.DeviceStatus.SEQUENCE_FIELD_NUMBER, _VARINT)
_READY = tag(pb.Readiness.READY_FIELD_NUMBER, _VARINT)
_READY_REASON = tag(pb.Readiness.REASON_FIELD_NUMBER, _VARINT)
_READY_DETAIL = tag(pb.Readiness.DETAIL_FIELD_NUMBER, _LEN)
_READY_LAST_GOOD = tag(pb.Readiness.LAST_GOOD_CYCLE_AGE_FIELD_NUMBER, _LEN)
_READY_LAST_CYCLE = tag(pb.Readiness.LAST_CYCLE_AGE_FIELD_NUMBER, _LEN)
# google.protobuf.Timestamp and Duration: int64 seconds = 1, int32 nanos = 2.
_SECONDS = tag(1, _VARINT)
_NANOS = tag(2, _VARINT)


def encode_duration(seconds: float) -> bytes:
    """``mapping.duration(seconds)`` serialized."""
    whole, nanos = duration_parts(seconds)
    return unsigned(_SECONDS, whole) + unsigned(_NANOS, nanos)


def encode_timestamp(wall: float) -> bytes:
    """``mapping.timestamp(wall)`` serialized."""
    whole, nanos = timestamp_parts(wall)
    if whole < 0:  # before 1970: a negative int64, left to protobuf
        return timestamp(wall).SerializeToString()
    return unsigned(_SECONDS, whole) + unsigned(_NANOS, nanos)


def encode_readiness(ready: Readiness, *, last_cycle_age_s: float | None) -> bytes:
    """``mapping.readiness(...)`` serialized: what each send of a cycle adds.

    The same as ``encode_readiness(ready, last_cycle_age_s=None)`` followed by
    :func:`encode_last_cycle_age`: the cycle's own age is the last field, so
    a verdict can be encoded once for many cycles.
    """
    out = unsigned(_READY, ready.ready) + unsigned(_READY_REASON, READINESS_REASON[ready.reason])
    if ready.detail:
        out += length_delimited(_READY_DETAIL, ready.detail.encode())
    if ready.last_good_age_s is not None:
        out += length_delimited(_READY_LAST_GOOD, encode_duration(ready.last_good_age_s))
    if last_cycle_age_s is not None:
        out += encode_last_cycle_age(last_cycle_age_s)
    return out


def encode_last_cycle_age(seconds: float) -> bytes:
    """A readiness's ``last_cycle_age`` field alone."""
    return length_delimited(_READY_LAST_CYCLE, encode_duration(seconds))


@dataclass(frozen=True, kw_only=True)
class EncodedCycle:
    """A CycleReport message but its readiness, as bytes on either side of it.

    ``head`` holds the fields numbered below ``readiness`` (devices included),
    ``tail`` those above it.
    """

    head: bytes
    tail: bytes

    def watch_response(self, readiness: bytes) -> bytes:
        """A serialized ``WatchResponse{cycle}`` carrying this send's encoded ``readiness``."""
        size = varint(len(readiness))
        body = len(self.head) + len(_CYCLE_READINESS) + len(size) + len(readiness) + len(self.tail)
        # One join: the message is copied once, not once per level.
        return b"".join(
            (_WATCH_CYCLE, varint(body), self.head, _CYCLE_READINESS, size, readiness, self.tail)
        )


def encode_cycle(
    report: CycleReport,
    *,
    devices: Mapping[int, DeviceState],
    namer: DeviceNamer,
    ready: Readiness,
    include: Include | None = None,
) -> EncodedCycle:
    """``mapping.cycle(...)`` without its readiness, encoded. Pure."""
    finished = encode_timestamp(report.finished_wall)
    parts = [
        unsigned(_CYCLE_SEQUENCE, report.sequence),
        length_delimited(_CYCLE_STARTED, encode_timestamp(report.started_wall)),
        length_delimited(_CYCLE_FINISHED, finished),
        length_delimited(_CYCLE_DURATION, encode_duration(report.duration_s)),
        unsigned(_CYCLE_ENFORCED, report.enforced),
        unsigned(_CYCLE_ABORT_REASON, ABORT_REASON[report.abort_reason]),
    ]
    parts += [
        length_delimited(
            _CYCLE_FAILURES,
            pb.CycleFailure(kind=f.kind.value, message=f.message).SerializeToString(),
        )
        for f in report.failures
    ]
    # Every device of this cycle has the same update time and sequence (17 and
    # 19), on either side of its own process count (18).
    updated = length_delimited(_DEVICE_LAST_UPDATE, finished)
    sequence = unsigned(_DEVICE_SEQUENCE, report.sequence)
    extra = len(updated) + len(sequence)
    for result, transition, health in cycle_devices(
        report, devices=devices, ready=ready, include=include
    ):
        device = _settled_bytes(result, namer, health, transition)
        head = device.heads.get(extra) or device.head(extra)
        parts += (head, updated, device.process_count, sequence, device.trailer)
    summary = report.failure_summary.encode()
    tail = (
        unsigned(_CYCLE_INTERRUPTED, report.interrupted)
        + (length_delimited(_CYCLE_FAILURE_SUMMARY, summary) if summary else b"")
        + unsigned(_CYCLE_OBSERVE, report.observe)
    )
    return EncodedCycle(head=b"".join(parts), tail=tail)


class _Settled:
    """A GPU's settled fields (1-16) encoded, and apart from them its process
    count (18) and its faults, telemetry, claims and DRA pool (20 to 23).

    Those come after the last update time (17) and the sequence (19), which
    change every cycle, so they are kept apart to keep the fields in number order.
    """

    __slots__ = ("fixed", "heads", "process_count", "size", "trailer")

    def __init__(self, fixed: bytes, process_count: bytes, trailer: bytes) -> None:
        self.fixed = fixed
        self.process_count = process_count
        self.trailer = trailer
        self.size = len(fixed) + len(process_count) + len(trailer)
        # By the size of what each cycle adds (update time, sequence): the
        # device's tag, length and settled fields.
        self.heads: dict[int, bytes] = {}

    def head(self, extra: int) -> bytes:
        head = self.heads[extra] = _CYCLE_DEVICES + varint(self.size + extra) + self.fixed
        return head


@functools.lru_cache(maxsize=4096)
def _settled_bytes(
    result: GpuResult, namer: DeviceNamer, health: DeviceHealth, last_transition_wall: float
) -> _Settled:
    message = pb.DeviceStatus()
    name = dra_device_name(result, result.index, result.uuid, namer)
    message.CopyFrom(settled(result, name, health, last_transition_wall))
    message.ClearField("process_count")
    # Fields 20 to 25 alone serialize to exactly their bytes in the whole message.
    trailer = pb.DeviceStatus(
        faults=message.faults,
        claims=message.claims,
        dra_pool_name=message.dra_pool_name,
        dra_driver_name=message.dra_driver_name,
    )
    if message.HasField("telemetry"):
        trailer.telemetry.CopyFrom(message.telemetry)
    if message.HasField("intended_watts"):
        trailer.intended_watts = message.intended_watts
    for later in (
        "faults",
        "telemetry",
        "claims",
        "dra_pool_name",
        "dra_driver_name",
        "intended_watts",
    ):
        message.ClearField(later)
    return _Settled(
        message.SerializeToString(),
        unsigned(_DEVICE_PROCESS_COUNT, result.process_count),
        trailer.SerializeToString(),
    )
