"""Run the node agent: the reconcile loop, its gRPC server and metrics, in order.

Start: assemble the agent, bind every listener, gRPC then metrics, then the sim
DRA driver's sockets where asked (a failure here is fatal before any cap is
touched), then start the loop. Stop (SIGTERM, SIGINT, or a supervised task
dying): the sim driver unregistered, gRPC health NOT_SERVING, streams ended,
server stopped with grace, then the loop stopped, owned GPUs restored, NVML
closed, and metrics (still scraped while caps are restored) stopped last.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from capwatch.agent.assembly import build_agent
from capwatch.agent.lifecycle import Agent, ShutdownSummary
from capwatch.agent.reports import CycleReport
from capwatch.agent.settings import AgentSettings
from capwatch.kit.heap import settle_heap
from capwatch.server.grpc.publication import Publication
from capwatch.server.grpc.serving import AgentServer

if TYPE_CHECKING:
    from capwatch.server.grpc.sim_driver import SimDriverServer
from capwatch.server.metrics.cycle_metrics import Metrics
from capwatch.server.metrics.endpoint import MetricsServer
from capwatch.server.settings import ServerSettings

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED = 0, 1


async def run_agent(
    settings: AgentSettings,
    server_settings: ServerSettings,
    *,
    on_report: Callable[[CycleReport], None] | None = None,
    on_serving: Callable[[AgentServer], Awaitable[None]] | None = None,
    on_stopped: Callable[[ShutdownSummary], None] | None = None,
    max_cycles: int | None = None,
    stop: asyncio.Event | None = None,
) -> int:
    """Run until stopped (SIGTERM, SIGINT, ``stop``); returns the process exit code.
    Raises CapwatchError at start-up."""
    agent = build_agent(settings, on_report=on_report)
    stop = stop or asyncio.Event()
    publication = _publication(agent, server_settings)
    server = AgentServer(settings=server_settings, publication=publication, on_fatal=stop.set)
    metrics = _metrics(agent, server, publication, server_settings, on_fatal=stop.set)
    try:
        driver = (
            _sim_driver(settings, agent, server, publication, on_fatal=stop.set)
            if settings.dra_sim_driver
            else None
        )
    except BaseException:
        agent.close()  # no API access: nothing was touched yet
        raise
    await _serve(agent, server, metrics, on_serving, driver)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    task = agent.start(stop, max_cycles=max_cycles)
    try:
        await stop.wait()
        log.info("stopping: readiness off, streams ended, then default caps restored")
        try:
            if driver is not None:
                await driver.stop(server_settings.grace_s)
            await server.stop()
        finally:
            # Whatever the server's stop did, the caps this agent set are restored.
            summary = await agent.stop()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if metrics is not None:
            await metrics.stop()
    died = task.done() and not task.cancelled() and task.exception() is not None
    log.info("stopped clean=%s restored=%d", str(summary.clean).lower(), len(summary.restored))
    if on_stopped is not None:
        on_stopped(summary)
    return EXIT_FAILED if died else EXIT_OK


def _publication(agent: Agent, server_settings: ServerSettings) -> Publication:
    return Publication(
        hub=agent.hub,
        clock=agent.hub.clock,
        node_name=agent.node_name,
        interval_s=agent.interval_s,
        namer=server_settings.device_namer(),
        pool_name=server_settings.dra_pool_name or agent.node_name,
        max_subscribers=server_settings.max_subscribers,
        reserved_local=server_settings.reserved_local_subscribers,
        max_per_peer=server_settings.max_streams_per_peer,
    )


def _metrics(
    agent: Agent,
    server: AgentServer,
    publication: Publication,
    server_settings: ServerSettings,
    *,
    on_fatal: Callable[[], None],
) -> MetricsServer | None:
    if server_settings.metrics_port is None:
        return None
    return MetricsServer(
        metrics=Metrics(
            publication=publication,
            certificate_reloads=server.certificate_reloads,
            malformed_requests=server.malformed_requests,
            events_dropped=agent.backend.events_dropped_total,
            pod_events=lambda: None if agent.pod_events is None else agent.pod_events.counts(),
        ),
        address=server_settings.metrics_address,
        port=server_settings.metrics_port,
        on_fatal=on_fatal,
    )


def _sim_driver(
    settings: AgentSettings,
    agent: Agent,
    server: AgentServer,
    publication: Publication,
    *,
    on_fatal: Callable[[], None],
) -> SimDriverServer:
    """The sim backend's DRA driver: its devices named as the mirror names them, its
    claims and slice through the cluster's API (in-cluster, else --kubeconfig)."""
    # Imported here: an agent without the sim driver never loads the kubelet's APIs
    # nor, with the sim backend, the API server's client.
    from capwatch.agent.dra.simdriver import SimDevice  # noqa: PLC0415
    from capwatch.agent.kube.claims import CLAIM_READ_TIMEOUT_S  # noqa: PLC0415
    from capwatch.agent.kube.slice_publisher import SlicePublisher  # noqa: PLC0415
    from capwatch.kube.client import ObjectRequests, api_transport  # noqa: PLC0415
    from capwatch.server.grpc.sim_driver import SimDriverServer  # noqa: PLC0415

    transport = api_transport(
        None if settings.kubeconfig is None else str(settings.kubeconfig),
        user_agent=f"capwatch-sim-driver/{agent.node_name}",
    )
    states = sorted(agent.hub.state().devices.values(), key=lambda s: s.index)
    return SimDriverServer(
        kubelet_dir=settings.kubelet_dir,
        node_name=agent.node_name,
        pool=publication.pool_name,
        devices=[
            SimDevice(name=publication.namer(s.index, s.uuid), index=s.index, uuid=s.uuid)
            for s in states
        ],
        nodes=server.nodes,
        claims=ObjectRequests(transport, timeout=CLAIM_READ_TIMEOUT_S),
        slices=SlicePublisher(transport),
        on_fatal=on_fatal,
    )


async def settle_heap_when_serving(_: AgentServer) -> None:
    """The agent command's ``on_serving``: its start-up heap out of the collector's reach
    before the first cycle (why: :mod:`capwatch.kit.heap`)."""
    log.debug("start-up heap settled: %d objects frozen", settle_heap())


async def _serve(
    agent: Agent,
    server: AgentServer,
    metrics: MetricsServer | None,
    on_serving: Callable[[AgentServer], Awaitable[None]] | None,
    driver: SimDriverServer | None,
) -> None:
    """Bind gRPC, then metrics, then the sim driver, then let ``on_serving`` run before
    the first cycle; a failure undoes what was started, closes the agent (no cap touched
    yet) and raises."""
    try:
        await server.start()
        try:
            if metrics is not None:
                await metrics.start()
            if driver is not None:
                await driver.start()
        except BaseException:
            if metrics is not None:
                await metrics.stop()
            await server.stop()
            raise
    except BaseException:
        agent.close()
        raise
    if on_serving is not None:
        try:
            await on_serving(server)
        except BaseException:
            if driver is not None:
                await driver.stop(0)
            await server.stop()
            if metrics is not None:
                await metrics.stop()
            agent.close()
            raise
