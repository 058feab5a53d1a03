"""The controller's cluster stream served in-process, from node states a test sets.

:class:`ClusterRig` is the real ``ClusterHealthServicer`` over a real
``ClusterView`` on a real gRPC server on 127.0.0.1:0; a test says what each
node is (:meth:`ClusterRig.set`) and the view numbers and publishes the
update exactly as the running controller's tracker would have it do. The
view's clock is a FakeClock, so every age the stream carries is chosen by the
test.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc

from capwatch.api.gen.capwatch.v1 import cluster_health_pb2 as cpb
from capwatch.controller.cluster.serving import ClusterHealthServicer, add_to_server
from capwatch.controller.cluster.state import ClusterView
from capwatch.controller.conditions import (
    AgentLink,
    CycleSummary,
    GpuSummary,
    NodeObservation,
    condition_of,
)
from capwatch.controller.tracking import NodeState
from capwatch.kit.clock import FakeClock

GPUS = 8


def gpu(index: int, *, failed: bool = False) -> GpuSummary:
    if failed:
        return GpuSummary(
            index=index,
            uuid=f"GPU-{index:08d}",
            healthy=False,
            outcome="failed",
            reason="write_failed",
            message="cap write failed: no_permission",
        )
    return GpuSummary(
        index=index,
        uuid=f"GPU-{index:08d}",
        healthy=True,
        outcome="enforced",
        reason="ok",
        message="capped at 350 W",
        applied_watts=350,
    )


def observation(
    node: str,
    *,
    clock: FakeClock,
    link: AgentLink = AgentLink.CONNECTED,
    failing: tuple[int, ...] = (),
    age_s: float = 0.5,
    error: str = "",
    gpus: int = GPUS,
) -> NodeObservation:
    """A node whose latest cycle finished ``age_s`` ago, GPUs ``failing`` failed."""
    if link is AgentLink.MISSING:
        return NodeObservation(node=node, link=link)
    summaries = tuple(gpu(i, failed=i in failing) for i in range(gpus))
    cycle = CycleSummary(
        sequence=7,
        enforced=not failing,
        abort_reason="",
        failure_kinds=(),
        failure_summary="",
        gpus=summaries,
        finished_at=clock.monotonic() - age_s,
        finished_wall=clock.wall() - age_s,
    )
    return NodeObservation(
        node=node,
        link=link,
        address=f"10.0.0.{sum(map(ord, node)) % 250}:50051",
        link_error=error,
        instance_id="agent-" + node,
        stale_after_s=45.0,
        cycle=cycle,
        gpus=summaries,
    )


@dataclass
class ClusterRig:
    view: ClusterView
    clock: FakeClock
    servicer: ClusterHealthServicer
    server: grpc.aio.Server
    port: int

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set(self, node: str, **how: object) -> NodeState:
        """Make ``node`` what ``how`` says (see :func:`observation`); published if the
        stream shows a change."""
        seen = observation(node, clock=self.clock, **how)
        state = NodeState(observation=seen, condition=condition_of(seen, self.clock.monotonic()))
        self.view.node_changed(state)
        return state

    def remove(self, node: str) -> None:
        self.view.node_removed(node)

    async def stop(self) -> None:
        """The server gone (streams cut, the view kept): a network cut, for a client."""
        await self.server.stop(0)
        async with asyncio.timeout(5):  # its streams' handlers have ended too
            while self.servicer.subscribers:  # noqa: ASYNC110
                await asyncio.sleep(0.01)

    async def serve_again(self, *, view: ClusterView | None = None) -> ClusterRig:
        """A server on the same port again: the same view (a cut healed) or a new one
        (the controller restarted, a new instance)."""
        await self.stop()
        # Not `view or ...`: an empty view is falsy (it has a length).
        same = self.view if view is None else view
        return await start_rig(view=same, clock=self.clock, port=self.port)


def new_view(clock: FakeClock, *, capacity: int = 64) -> ClusterView:
    view = ClusterView(clock=clock, capacity=capacity)
    view.shard = lambda: cpb.Shard(
        index=0, count=1, lease_name="capwatch-controller-0", holder="ctl-0", leading=True
    )
    return view


async def start_rig(
    *, view: ClusterView | None = None, clock: FakeClock | None = None, port: int = 0
) -> ClusterRig:
    clock = clock or FakeClock()
    view = new_view(clock) if view is None else view
    server = grpc.aio.server()
    servicer = ClusterHealthServicer(view)
    add_to_server(servicer, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    assert bound, f"cannot bind 127.0.0.1:{port}"
    await server.start()
    return ClusterRig(view=view, clock=clock, servicer=servicer, server=server, port=bound)
