"""grpc.health.v1 for the agent: SERVING exactly when the readiness rule holds.

The status follows cycles as they land, and also flips to NOT_SERVING when the
staleness bound passes with no cycle (a hung cycle publishes nothing, so a
timer, not a publish, has to notice). ``List`` answers every service's
status, as grpc's health.proto defines it.
"""

from __future__ import annotations

import logging
from typing import Any

from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

from capwatch.server.grpc.publication import Publication

log = logging.getLogger(__name__)

SERVICES = ("", "capwatch.v1.NodeHealthService")
# Re-evaluate this long after the moment the rule can flip, so the flip has happened.
_EPSILON_S = 0.01
# types-grpcio-health-checking's stubs predate List and lack its messages.
_LIST_RESPONSE: Any = health_pb2.HealthListResponse  # type: ignore[attr-defined]


class ListingHealthServicer(HealthServicer):
    """grpcio-health-checking's asyncio servicer, plus ``List``.

    Its ``List`` answers UNIMPLEMENTED although reflection lists the method.
    The base keeps its statuses private, so every ``set`` and the graceful
    shutdown are mirrored here, with the base's own rules: ``""`` starts
    SERVING, and after the shutdown began every status is NOT_SERVING and
    stays so.
    """

    def __init__(self) -> None:
        super().__init__()
        self._statuses: dict[str, int] = {"": health_pb2.HealthCheckResponse.SERVING}
        self._shutting_down = False

    async def set(self, service: str, status: int) -> None:
        await super().set(service, status)
        if not self._shutting_down:
            self._statuses[service] = status

    async def enter_graceful_shutdown(self) -> None:
        await super().enter_graceful_shutdown()
        self._shutting_down = True
        for service in self._statuses:
            self._statuses[service] = health_pb2.HealthCheckResponse.NOT_SERVING

    async def List(self, request: Any, context: Any) -> Any:
        """Every service with a status, as one non-atomic snapshot (health.proto)."""
        return _LIST_RESPONSE(
            statuses={
                service: health_pb2.HealthCheckResponse(status=status)
                for service, status in sorted(self._statuses.items())
            }
        )


async def track_readiness(health: HealthServicer, publication: Publication) -> None:
    """Keep the health status in step with readiness until the publication stops."""
    hub = publication.hub
    last: int | None = None
    # Released readers make hub.wait return at once: stop rather than spin.
    while not publication.stopping.is_set() and not hub.readers_released:
        view = publication.view()
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if view.readiness.ready
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        if status != last:
            for service in SERVICES:
                await health.set(service, status)
            log.info(
                "grpc health status=%s readiness=%s",
                health_pb2.HealthCheckResponse.ServingStatus.Name(status),
                view.readiness.text,
            )
            last = status
        timeout = publication.interval_s
        age = view.last_cycle_age_s
        if view.readiness.ready and age is not None:
            timeout = max(0.0, publication.stale_after_s - age) + _EPSILON_S
        await hub.wait(view.state.sequence, timeout)
