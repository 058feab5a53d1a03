"""The composition root of ``capwatch controller``: build, start in order, stop in order.

Start: bind the cluster stream's gRPC port, the metrics and the probes (a port
that cannot be bound is fatal before anything is followed); start discovery,
which starts one stream per agent of this shard; start the condition writer and
the DeviceTaintRule writer; campaign for the shard's Lease. Every replica follows
its shard's streams and serves the cluster stream; only the Lease holder writes.

Stop (SIGTERM, SIGINT, or a supervised task dying): readiness off; the
cluster stream ended and its server stopped; the writers stopped (no new
write; those in flight finish or time out); only then the Lease released, so
a standby takes over at its next retry and no two replicas ever write at once;
then the streams, discovery and the API client closed; metrics last.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

import grpc

from capwatch.api.gen.capwatch.v1 import cluster_health_pb2 as cpb
from capwatch.client.channels import SharedChannels
from capwatch.client.node_health import NodeHealthClient
from capwatch.controller.cluster import mapping
from capwatch.controller.cluster.serving import ClusterServer
from capwatch.controller.cluster.state import ClusterView
from capwatch.controller.conditions import NodeCondition
from capwatch.controller.discovery import DiscoverySink, KubernetesDiscovery, StaticDiscovery
from capwatch.controller.dryrun import PrintingApi, Unfenced
from capwatch.controller.following import Followers
from capwatch.controller.leasing import LeaseElector
from capwatch.controller.metrics import ControllerMetrics
from capwatch.controller.settings import ControllerSettings
from capwatch.controller.sharding import shard_of
from capwatch.controller.tracking import NodeTracker
from capwatch.controller.writes.recorder import EventRecorder
from capwatch.controller.writes.taints import TaintWriter
from capwatch.controller.writes.writer import ConditionWriter
from capwatch.kit.clock import Clock, SystemClock
from capwatch.kit.pacing import TokenBucket
from capwatch.kit.version import package_version
from capwatch.kube.informer import WatchPolicy
from capwatch.server.http.exposition import RegistryServer
from capwatch.server.http.readyz import Answer, ReadyzServer
from capwatch.server.listeners import ServeError

if TYPE_CHECKING:  # the Kubernetes client loads only without --dry-run
    from capwatch.controller.kube import KubeApi

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED = 0, 1
# Discovery trusts the API server's list+watch as the agent's pod view does.
DISCOVERY_POLICY = WatchPolicy(stale_after=60.0)
METRICS_ADDRESS = "0.0.0.0"  # noqa: S104 - Prometheus scrapes from another pod
PROBE_ADDRESS = "0.0.0.0"  # noqa: S104 - the kubelet probes the pod IP


class _ShardSink:
    """Discovery's changes for this shard's nodes, to the tracker, followers and writer."""

    def __init__(
        self,
        *,
        settings: ControllerSettings,
        tracker: NodeTracker,
        followers: Followers,
        writer: ConditionWriter,
    ) -> None:
        self._shards, self._index = settings.shards, settings.shard_index
        self._tracker, self._followers, self._writer = tracker, followers, writer

    def _ours(self, node: str) -> bool:
        return shard_of(node, self._shards) == self._index

    def target(self, node: str, address: str | None) -> None:
        if self._ours(node):
            self._tracker.target(node, address)
            self._followers.target(node, address)

    def gpu_node(
        self,
        node: str,
        *,
        present: bool,
        condition: NodeCondition | None,
        version: int | None = None,
    ) -> None:
        if self._ours(node):
            # The writer learns what the Node carries before the tracker asks for a write.
            self._writer.observed(node, condition, version=version)
            self._tracker.gpu_node(node, present=present)


@dataclass(kw_only=True)
class Controller:
    """Everything ``capwatch controller`` runs, assembled (see :func:`build_controller`)."""

    settings: ControllerSettings
    clock: Clock
    tracker: NodeTracker
    followers: Followers
    writer: ConditionWriter
    taints: TaintWriter
    metrics: ControllerMetrics
    discovery: KubernetesDiscovery | StaticDiscovery
    elector: LeaseElector | None  # None: --dry-run, no Lease
    cluster: ClusterView
    closers: list[Callable[[], None]] = field(default_factory=list)
    stopping: bool = False

    @property
    def leading(self) -> bool:
        return self.elector is None or self.elector.leading

    def sink(self) -> DiscoverySink:
        return _ShardSink(
            settings=self.settings,
            tracker=self.tracker,
            followers=self.followers,
            writer=self.writer,
        )

    def ready(self) -> bool:
        return not self.stopping and self.discovery.sync_problem() is None

    def readiness(self) -> Answer:
        """Ready while discovery is in sync: a standby serves the cluster stream too."""
        if self.stopping:
            return Answer(status=503, body="stopping\n")
        problem = self.discovery.sync_problem()
        if problem is not None:
            return Answer(status=503, body=f"discovery {problem}\n")
        role = "leader" if self.leading else "standby"
        return Answer(status=200, body=f"ok: {role}, following {len(self.followers)} agents\n")

    def shard_message(self) -> cpb.Shard:
        elector = self.elector
        return mapping.shard(
            index=self.settings.shard_index,
            count=self.settings.shards,
            lease_name="" if elector is None else elector.name,
            holder="" if elector is None else elector.holder,
            leading=self.leading,
        )


def _client_factory(settings: ControllerSettings) -> Callable[[str, str], NodeHealthClient]:
    """Clients for the agents, every node at one address streaming on one channel (each
    client releases it when it closes; the last one closes it)."""
    tls = settings.agent_tls
    credentials = None
    options: list[tuple[str, Any]] = []
    if tls is not None:
        # Read once at start: a renewed client certificate needs a restart.
        credentials = grpc.ssl_channel_credentials(
            root_certificates=tls.ca.read_bytes(),
            certificate_chain=None if tls.cert is None else tls.cert.read_bytes(),
            private_key=None if tls.key is None else tls.key.read_bytes(),
        )
        if tls.server_name:
            options.append(("grpc.ssl_target_name_override", tls.server_name))
    channels = SharedChannels(credentials=credentials, options=options)

    def make(node: str, address: str) -> NodeHealthClient:
        return NodeHealthClient(target=address, node_name=node, channels=channels)

    return make


def build_controller(
    settings: ControllerSettings, *, out: TextIO | None = None, clock: Clock | None = None
) -> Controller:
    """Assemble the controller; nothing runs yet. Raises ConfigError (bad kubeconfig)."""
    clock = clock or SystemClock()
    tracker = NodeTracker(clock=clock)
    holder: dict[str, LeaseElector] = {}
    metrics = ControllerMetrics(
        states=tracker.states,
        leading=lambda: "elector" not in holder or holder["elector"].leading,
        shard=settings.shard_index,
        shards=settings.shards,
        identity=settings.identity,
        version=package_version(),
    )
    closers: list[Callable[[], None]] = []
    api: PrintingApi | KubeApi
    fence: Unfenced | LeaseElector
    discovery: StaticDiscovery | KubernetesDiscovery
    elector = None
    if settings.dry_run:
        assert settings.targets is not None  # settings validation guarantees it
        api, fence = PrintingApi(out or sys.stdout), Unfenced()
        discovery = StaticDiscovery(settings.targets)
    else:
        api, discovery = _kubernetes(settings, clock, closers)
        fence = elector = holder["elector"] = LeaseElector(
            api=api,
            name=settings.lease_name,
            identity=settings.identity,
            clock=clock,
            config=settings.lease,
            observer=metrics,
        )
    events = EventRecorder(api=api, fence=fence, clock=clock, observer=metrics)
    writer = ConditionWriter(
        api=api,
        events=events,
        fence=fence,
        clock=clock,
        heartbeat_s=settings.condition_heartbeat_s,
        observer=metrics,
    )
    taints = TaintWriter(
        api=api,
        events=events,
        fence=fence,
        clock=clock,
        policy=settings.taints,
        ours=lambda node: shard_of(node, settings.shards) == settings.shard_index,
        known=lambda node: tracker.get(node) is not None,
        observer=metrics,
    )
    if elector is not None:

        def leading() -> None:
            writer.resume()
            taints.resume()

        elector.on_started = leading
    return _wired(
        Controller(
            settings=settings,
            clock=clock,
            tracker=tracker,
            followers=Followers(
                tracker=tracker,
                clients=_client_factory(settings),
                dials=TokenBucket(
                    rate=settings.dial_rate, burst=math.ceil(settings.dial_rate), clock=clock
                ),
            ),
            writer=writer,
            taints=taints,
            metrics=metrics,
            discovery=discovery,
            elector=elector,
            cluster=ClusterView(clock=clock),
            closers=closers,
        )
    )


def _kubernetes(
    settings: ControllerSettings, clock: Clock, closers: list[Callable[[], None]]
) -> tuple[KubeApi, KubernetesDiscovery]:
    """The API client and the discovery that reads through it."""
    from capwatch.controller.kube import KubeApi, api_client  # noqa: PLC0415
    from capwatch.kube.client import CollectionRequests  # noqa: PLC0415

    assert settings.namespace is not None  # settings validation guarantees it
    client = api_client(
        None if settings.kubeconfig is None else str(settings.kubeconfig),
        identity=settings.identity,
    )
    kube = KubeApi(
        client,
        namespace=settings.namespace,
        identity=settings.identity,
        release=settings.release,
        clock=clock,
    )
    closers.append(kube.close)
    pods = None
    if settings.targets is None:
        pods = CollectionRequests(
            client,
            path=f"/api/v1/namespaces/{settings.namespace}/pods",
            label_selector=settings.agent_selector,
        )
    discovery = KubernetesDiscovery(
        pods=pods,
        nodes=CollectionRequests(
            client, path="/api/v1/nodes", label_selector=settings.gpu_node_selector
        ),
        static_targets=settings.targets,
        agent_port=settings.agent_port,
        policy=DISCOVERY_POLICY,
        clock=clock,
    )
    return kube, discovery


def _wired(controller: Controller) -> Controller:
    """The links between the parts (each needs the others built first)."""
    controller.tracker.add_listener(controller.writer)
    controller.tracker.add_listener(controller.taints)
    controller.tracker.add_listener(controller.cluster)
    controller.cluster.shard = controller.shard_message
    return controller


async def run_controller(
    settings: ControllerSettings,
    *,
    out: TextIO | None = None,
    on_started: Callable[[Controller], Awaitable[None]] | None = None,
    stop: asyncio.Event | None = None,
) -> int:
    """Run until stopped; returns the exit code. Raises CapwatchError at start-up."""
    controller = build_controller(settings, out=out)
    stop = stop or asyncio.Event()
    running = _Running(controller, stop)
    try:
        await running.bind()
    except BaseException:
        await running.unbind()
        raise
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        running.start()
        if on_started is not None:
            await on_started(controller)
        await stop.wait()
        log.info("stopping: streams served end, writes stop, then the Lease is released")
        await running.shut_down()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await running.unbind()
    return EXIT_FAILED if running.died else EXIT_OK


class _Running:
    """The ordered start and stop of an assembled controller."""

    def __init__(self, controller: Controller, stop: asyncio.Event) -> None:
        self.controller = controller
        self._stop = stop
        self.died: list[asyncio.Task[Any]] = []
        settings = controller.settings
        self.server = ClusterServer(
            view=controller.cluster, listen=settings.grpc_listen, ready=controller.ready
        )
        self.probes = None
        if settings.probe_port is not None:
            self.probes = ReadyzServer(
                controller.readiness,
                host=PROBE_ADDRESS,
                port=settings.probe_port,
                extra_routes={"/healthz": lambda: Answer(status=200, body="ok\n")},
            )
        self.metrics_http = None
        if settings.metrics_port is not None:
            self.metrics_http = RegistryServer(
                registry=controller.metrics.registry,
                address=METRICS_ADDRESS,
                port=settings.metrics_port,
            )
        self._elector_task: asyncio.Task[None] | None = None

    async def bind(self) -> None:
        """Every port, before anything is followed: a taken port is fatal here."""
        await self.server.start()
        if self.metrics_http is not None:
            await self.metrics_http.start()
        if self.probes is not None:
            try:
                await self.probes.start()
            except OSError as exc:
                # asyncio's strerror embeds the address as a Python tuple; errno says it plainly.
                reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
                where = f"{PROBE_ADDRESS}:{self.controller.settings.probe_port}"
                raise ServeError(f"--probe-port: cannot listen on {where}: {reason}") from exc

    def start(self) -> None:
        controller = self.controller
        controller.discovery.start(controller.sink())
        controller.writer.start()
        controller.taints.start()
        if controller.elector is None:
            controller.taints.resume()  # a dry run leads from the start: nothing to list
        tasks = [*controller.writer.tasks, *controller.taints.tasks, *self.server.tasks]
        if controller.elector is not None:
            self._elector_task = asyncio.create_task(
                controller.elector.run(), name="capwatch-lease"
            )
            tasks.append(self._elector_task)
        for task in tasks:
            task.add_done_callback(self._supervise)
        settings = controller.settings
        log.info(
            "controller started shard=%d shards=%d identity=%s dry_run=%s",
            settings.shard_index,
            settings.shards,
            settings.identity,
            str(settings.dry_run).lower(),
        )

    def _supervise(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("task %s died; stopping", task.get_name(), exc_info=task.exception())
            self.died.append(task)
            self._stop.set()

    async def shut_down(self) -> None:
        controller = self.controller
        controller.stopping = True
        await self.server.stop()
        await controller.writer.stop()
        await controller.taints.stop()
        if self._elector_task is not None:
            self._elector_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._elector_task
        if controller.elector is not None:
            # Only now: no condition write or Event is in flight (a renewal may be: the
            # release reads the Lease back if that lands first).
            await controller.elector.release()
        await controller.followers.close()
        controller.discovery.close()
        controller.tracker.close()

    async def unbind(self) -> None:
        if self.probes is not None:
            await self.probes.stop()
        await self.server.stop()
        for close in self.controller.closers:
            close()
        if self.metrics_http is not None:
            await self.metrics_http.stop()  # last: scraped while the controller stops
