"""Limits of the capwatch.v1 Watch request, shared by the server and its clients.

The server refuses requests outside them (INVALID_ARGUMENT); the client
library and ``capwatch watch`` check them first, so a mistake is reported as
a configuration error before anything is sent. Kept apart from the servicer
so a client does not load the server's modules.

A client may ask for a heartbeat at most once a second. Heartbeats tell a
quiet agent from a dead one, which is a matter of seconds (readiness goes
stale after three intervals, 45 s by default), and each one costs the agent
an encoding and a send on its event loop, the loop that serves every other
stream: at the former 50 ms floor, 1,000 streams asked for 20,000 messages a
second, got about 4,700 and stretched the cycle period by 20-60 %. At one
second, streams cost at most one heartbeat a second each, whatever they ask.
"""

from __future__ import annotations

from google.protobuf.duration_pb2 import Duration

from capwatch.api.durations import seconds

MIN_HEARTBEAT_S = 1.0
MAX_HEARTBEAT_S = 3600.0
MAX_FILTER_UUIDS = 256
MAX_UUID_LENGTH = 128


def requested_heartbeat(requested: Duration) -> float | None:
    """The heartbeat period a Watch request asks for, in seconds; None for the server's
    default (zero, sent or not: the protos say so, and a JSON client sending "0s" sets
    the field). Raises :class:`~capwatch.api.durations.DurationError` outside 1 s to 1 h (the
    agent's Watch and the controller's cluster Watch alike)."""
    if not (requested.seconds or requested.nanos):
        return None
    return seconds(requested, field="heartbeat_interval", low=MIN_HEARTBEAT_S, high=MAX_HEARTBEAT_S)
