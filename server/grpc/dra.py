"""The kubelet's DRA resource-health API, served from the hub (v1alpha1 and v1).

Every message carries the full device list: on open, after every cycle, and
again whenever nothing happened for one interval, well within
``health_check_timeout_seconds`` (the staleness bound, rounded up), because the
kubelet expires devices it has not heard about and ignores
``last_updated_time``. Messages are stable reason text with no live numbers:
each change of message is a pod status update in the kubelet. A GPU with an
active device fault (agent.health.faults) is UNHEALTHY and its message names the
faults by their stable summaries ("XID 79", "GPU lost"), never their counts.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import grpc

from capwatch.agent.devices import DeviceHealth, DeviceState, device_health
from capwatch.agent.reports import Outcome
from capwatch.api.gen.v1 import dra_health_pb2 as v1_pb
from capwatch.api.gen.v1 import dra_health_pb2_grpc as v1_grpc
from capwatch.api.gen.v1alpha1 import dra_health_pb2 as v1alpha1_pb
from capwatch.api.gen.v1alpha1 import dra_health_pb2_grpc as v1alpha1_grpc
from capwatch.kit.readiness import ReadinessReason
from capwatch.server.grpc.mapping import NOT_REPORTED, dra_device_name, dra_pool_name
from capwatch.server.grpc.nodes import NodeDirectory, metadata_node
from capwatch.server.grpc.publication import Publication, View

MAX_MESSAGE = 1024  # the kubelet truncates longer messages

# The same numbers in both versions (HealthStatus UNKNOWN=0, HEALTHY=1, UNHEALTHY=2).
_HEALTH = {DeviceHealth.UNKNOWN: 0, DeviceHealth.HEALTHY: 1, DeviceHealth.UNHEALTHY: 2}

_HEALTHY_TEXT = {
    Outcome.ENFORCED: "capwatch: power cap enforced",
    Outcome.IDLE: "capwatch: idle, no power cap required",
    Outcome.RELEASED: "capwatch: idle, default power limit restored",
    Outcome.OBSERVED: "capwatch: observe mode, no power cap written",
    Outcome.LEFT: "capwatch: no power cap asked, limit left as it is",
}


def device_message(state: DeviceState, view: View) -> tuple[DeviceHealth, str]:
    """The health and the stable message for one GPU, as of ``view``."""
    health = device_health(state, latest=view.state.latest, readiness=view.readiness)
    latest = view.state.latest
    if view.readiness.reason is ReadinessReason.NO_CYCLE_YET or state.result is None:
        return (
            health,
            f"capwatch: no enforcement cycle has reported on this GPU yet ({NOT_REPORTED})",
        )
    # The readiness rule reports staleness before a failed cycle, so a hung
    # agent's last results expire whatever they were.
    if view.readiness.reason is ReadinessReason.STALE:
        return health, "capwatch: agent has not completed a cycle within its staleness bound"
    if latest is not None and latest.abort_reason is not None:
        return health, f"capwatch: enforcement cycle aborted ({latest.abort_reason.value})"
    result = state.result
    # Faults first: what the device has outlasts what one cycle's write did.
    faults = ", ".join(f.summary for f in result.faults)
    prefix = f"capwatch: device fault ({faults}); " if faults else "capwatch: "
    if result.outcome is not Outcome.FAILED:
        text = _HEALTHY_TEXT[result.outcome].removeprefix("capwatch: ")
        return health, (prefix + text)[:MAX_MESSAGE]
    detail = result.reason.value
    if result.error_class is not None:
        detail += f": {result.error_class.value}"
    return health, f"{prefix}power cap not enforced ({detail})"[:MAX_MESSAGE]


class _DraServicer:
    """One implementation for both API versions; ``pb`` is the version's message module."""

    def __init__(self, nodes: NodeDirectory, pb: ModuleType) -> None:
        self._nodes = nodes
        self._pb = pb

    def response(self, pub: Publication, view: View) -> Any:
        pb = self._pb
        # Whole seconds, rounded up: the kubelet's field is an int64.
        timeout_s = math.ceil(pub.stale_after_s)
        devices = []
        for state in sorted(view.state.devices.values(), key=lambda s: s.index):
            health, message = device_message(state, view)
            name = dra_device_name(state.result, state.index, state.uuid, pub.namer)
            devices.append(
                pb.DeviceHealth(
                    device=pb.DeviceIdentifier(
                        pool_name=dra_pool_name(state.result, pub.pool_name),
                        device_name=name,
                    ),
                    health=_HEALTH[health],
                    last_updated_time=int(state.last_update_wall),
                    health_check_timeout_seconds=timeout_s,
                    message=message,
                )
            )
        return pb.NodeWatchResourcesResponse(devices=devices)

    async def NodeWatchResources(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        # The request has no field for it: a pool's node is named in the metadata.
        pub = (await self._nodes.resolve(metadata_node(context), context)).publication
        slot = await pub.admit(context)
        try:
            view = pub.view()
            cursor = view.state.sequence
            yield self.response(pub, view)
            # Re-send at least every interval: a third of the kubelet's timeout.
            while not pub.stopping.is_set():
                await _next_cycle(pub, cursor)
                if pub.stopping.is_set():
                    return
                view = pub.view()
                cursor = view.state.sequence
                pub.messages_sent += 1
                yield self.response(pub, view)
        finally:
            pub.unsubscribe(slot)


async def _next_cycle(pub: Publication, cursor: int) -> None:
    """Until a cycle after ``cursor``, an interval passes, or ``pub`` stops: a pool's node
    gone silent sets ``stopping`` with no cycle to wake its streams (an agent's shutdown
    also releases the hub's readers)."""
    cycle = asyncio.ensure_future(pub.hub.wait(cursor, pub.interval_s))
    stopped = asyncio.ensure_future(pub.stopping.wait())
    try:
        await asyncio.wait((cycle, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in (cycle, stopped):
            waiting.cancel()
        await asyncio.gather(cycle, stopped, return_exceptions=True)


class DraV1alpha1Servicer(_DraServicer, v1alpha1_grpc.DRAResourceHealthServicer):
    def __init__(self, nodes: NodeDirectory) -> None:
        _DraServicer.__init__(self, nodes, v1alpha1_pb)


class DraV1Servicer(_DraServicer, v1_grpc.DRAResourceHealthServicer):
    def __init__(self, nodes: NodeDirectory) -> None:
        _DraServicer.__init__(self, nodes, v1_pb)
