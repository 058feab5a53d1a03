"""What every stream needs to know about the agent it publishes, in one place.

The servicers (capwatch.v1, the DRA mirrors, grpc health) read the hub through
a :class:`Publication`, which also admits subscribers so the limits hold across
all streaming services together (the rules: :mod:`capwatch.server.admission`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import grpc

from capwatch.agent.hub import Hub, HubState
from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.kit.clock import Clock
from capwatch.kit.readiness import Readiness
from capwatch.kit.throttling import ThrottledLog
from capwatch.server.admission import Admission, Refusal, Slot, StreamLimits, peer_address
from capwatch.server.grpc.mapping import DeviceNamer, Include
from capwatch.server.grpc.mapping import snapshot as snapshot_message

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class View:
    """The hub's state and the readiness rule applied to it, at one monotonic instant."""

    state: HubState
    readiness: Readiness
    now_monotonic: float
    now_wall: float

    @property
    def last_cycle_age_s(self) -> float | None:
        latest = self.state.latest
        return None if latest is None else self.now_monotonic - latest.finished_monotonic


class Publication:
    """The hub as the servicers see it. Without ``reserved_local`` and ``max_per_peer``
    there is no local reserve and no limit per address (the command line's defaults set
    both; see :mod:`capwatch.server.settings`)."""

    def __init__(
        self,
        *,
        hub: Hub,
        clock: Clock,
        node_name: str,
        interval_s: float,
        namer: DeviceNamer,
        pool_name: str,
        max_subscribers: int,
        reserved_local: int = 0,
        max_per_peer: int | None = None,
    ) -> None:
        self.hub = hub
        self.clock = clock
        self.node_name = node_name
        self.interval_s = interval_s
        self.namer = namer
        self.pool_name = pool_name
        self.admission = Admission(
            StreamLimits(
                max_subscribers=max_subscribers,
                reserved_local=reserved_local,
                max_per_peer=max_per_peer,
            )
        )
        self.messages_sent = 0
        self.stopping = asyncio.Event()
        self._refusal_log = ThrottledLog(log)

    @property
    def subscribers(self) -> int:
        return self.admission.subscribers

    @property
    def stale_after_s(self) -> float:
        return self.hub.stale_after_s

    def view(self) -> View:
        state = self.hub.state()
        return View(
            state=state,
            readiness=self.hub.readiness(state),
            now_monotonic=self.clock.monotonic(),
            now_wall=self.clock.wall(),
        )

    async def check_node(self, expected: str, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """End the call (FAILED_PRECONDITION) if the client expects another node than this.

        A controller names the node it dialled: an agent that answers at a recycled
        pod IP must never report its own health as another node's."""
        if expected and expected != self.node_name:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this agent serves node {self.node_name!r}, not {expected!r}",
            )

    async def admit(self, context: grpc.aio.ServicerContext[Any, Any]) -> Slot:
        """Claim a subscriber slot, or end the call with the status that says why."""
        if self.stopping.is_set():
            await context.abort(grpc.StatusCode.UNAVAILABLE, "agent is shutting down")
        peer = context.peer()
        claimed = self.admission.claim(peer_address(peer))
        if isinstance(claimed, Refusal):
            self._refused(peer, claimed)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, claimed.message)
        return claimed

    def unsubscribe(self, slot: Slot) -> None:
        self.admission.release(slot)

    def _refused(self, peer: str, refusal: Refusal) -> None:
        self._refusal_log.warning(
            "stream refused peer=%s reason=%s: %s", peer, refusal.reason.value, refusal.message
        )

    def snapshot(
        self,
        view: View,
        *,
        resync: bool = False,
        include: Include | None = None,
    ) -> pb.NodeSnapshot:
        return snapshot_message(
            node_name=self.node_name,
            instance_id=self.hub.instance_id,
            interval_s=self.interval_s,
            stale_after_s=self.stale_after_s,
            sequence=view.state.sequence,
            latest=view.state.latest,
            devices=view.state.devices,
            namer=self.namer,
            ready=view.readiness,
            last_cycle_age_s=view.last_cycle_age_s,
            resync=resync,
            include=include,
        )
