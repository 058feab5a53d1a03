"""The composition root: build a runnable :class:`Agent` from settings.

This is the one place that chooses implementations (NVML or the simulator,
the Kubernetes API or the scenario for pods, the real /proc or a materialised
one). Everything it builds is passed to its users by constructor.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from capwatch.agent.attribution import Attributor, FsProcRoot
from capwatch.agent.capping import CapBounds, Mode
from capwatch.agent.departure import DepartureCheck
from capwatch.agent.devices import inventory
from capwatch.agent.dra.claims import ClaimView
from capwatch.agent.forgetting import ForgetRequests
from capwatch.agent.gpus import GpuBackend, GpuError
from capwatch.agent.health.faults import FaultTracker
from capwatch.agent.hub import Hub
from capwatch.agent.lifecycle import Agent
from capwatch.agent.nudge import Nudge
from capwatch.agent.ownership import LoadStatus, OwnershipStore
from capwatch.agent.podevents import PodEvents
from capwatch.agent.pods import PodView
from capwatch.agent.reconciling import CycleListener, Reconciler
from capwatch.agent.reports import CycleReport
from capwatch.agent.running import AgentLoop, CycleThread
from capwatch.agent.settings import AgentSettings, BackendKind
from capwatch.agent.sim.claims import SimClaimView
from capwatch.agent.sim.limits import PersistentLimits
from capwatch.agent.sim.scenario import Scenario, default_scenario, load_scenario
from capwatch.agent.sim.views import SimGpuBackend, SimPodView
from capwatch.agent.sim.world import SimWorld
from capwatch.agent.stepping import Policy
from capwatch.kit.clock import Clock, SystemClock
from capwatch.kit.errors import BackendUnavailable, CapwatchError, PodViewError
from capwatch.kit.scratch import ScratchDirectory

log = logging.getLogger(__name__)

# Each of the departure check's GETs at shutdown (three fit in DEPARTURE_TIMEOUT_S).
DEPARTURE_READ_TIMEOUT_S = 2.5


@dataclass(frozen=True, kw_only=True)
class _Parts:
    backend: GpuBackend
    pods: PodView
    proc_root: Path
    node_name: str
    listeners: tuple[CycleListener, ...] = ()
    cleanups: tuple[Callable[[], None], ...] = ()
    pod_events: PodEvents | None = None
    claims: ClaimView | None = None
    nudge: Nudge | None = None  # told by the watches when a cycle should come sooner
    departure: DepartureCheck | None = None  # None: restore at every stop (standalone)


def load_settings_scenario(settings: AgentSettings) -> Scenario:
    """The scenario the sim backend will run (the built-in one unless a file is given)."""
    return default_scenario() if settings.scenario is None else load_scenario(settings.scenario)


def build_agent(
    settings: AgentSettings,
    *,
    clock: Clock | None = None,
    on_report: Callable[[CycleReport], None] | None = None,
) -> Agent:
    """Assemble everything; raises CapwatchError if the agent cannot start at all."""
    clock = clock or SystemClock()
    parts = (
        _simulated(settings) if settings.gpu_backend is BackendKind.SIM else _real(settings, clock)
    )
    try:
        return _assemble(settings, parts, clock, on_report)
    except BaseException:
        for close in (parts.pods.close, parts.backend.close, *parts.cleanups):
            close()
        raise


def _assemble(
    settings: AgentSettings,
    parts: _Parts,
    clock: Clock,
    on_report: Callable[[CycleReport], None] | None,
) -> Agent:
    # GPU discovery at start is fatal on failure: an agent that cannot see its
    # GPUs enforces nothing, and CrashLoopBackOff says so louder than NotReady.
    try:
        count = parts.backend.device_count()
    except GpuError as exc:
        raise BackendUnavailable(f"GPU discovery failed: {exc}") from exc
    if count == 0:
        # Ready with nothing to enforce would hide a node whose driver lost its
        # GPUs (or a DaemonSet scheduled where there are none).
        raise BackendUnavailable(
            f"no GPUs: the {settings.gpu_backend.value} backend reports 0 devices"
        )
    store = OwnershipStore(settings.state_dir, clock=clock)
    status = store.load()
    if status is LoadStatus.LOADED:
        log.info("ownership record loaded gpus=%d path=%s", len(store.records()), store.path)
    uuids = _uuids(parts.backend, count)
    faults = FaultTracker(
        policy=settings.xid_policy,
        recovery_s=settings.fault_recovery_s,
        wall=clock.wall,
        monotonic=clock.monotonic,
    )
    faults.identified(uuids)  # a GPU lost before its first cycle is still known
    reconciler = Reconciler(
        backend=parts.backend,
        pods=parts.pods,
        attributor=Attributor(FsProcRoot(parts.proc_root)),
        store=store,
        clock=clock,
        policy=Policy(
            annotation_key=settings.annotation_key,
            safe_default_watts=settings.safe_default_watts,
            bounds=CapBounds(
                floor_watts=settings.cap_floor_watts, ceiling_watts=settings.cap_ceiling_watts
            ),
            mode=settings.mode,
            unclaimed=settings.unclaimed_policy,
        ),
        initial_device_count=count,
        release_unowned_idle=status is LoadStatus.UNREADABLE,
        listeners=parts.listeners,
        forget=ForgetRequests(settings.state_dir),
        faults=faults,
        claims=parts.claims,
    )
    hub = Hub(
        clock=clock,
        stale_after_s=settings.stale_after_s,
        devices=inventory(uuids, wall=clock.wall()),
    )
    cycle_thread = CycleThread()
    loop = AgentLoop(
        reconciler=reconciler,
        hub=hub,
        clock=clock,
        interval_s=settings.interval_s,
        cycle_thread=cycle_thread,
        on_report=_both(parts.pod_events.observe if parts.pod_events else None, on_report),
        nudge=parts.nudge,
    )
    log.info(
        "agent assembled node=%s backend=%s mode=%s unclaimed_policy=%s gpus=%d interval=%gs "
        "stale_after=%gs",
        parts.node_name,
        settings.gpu_backend.value,
        settings.mode.value,
        settings.unclaimed_policy.value,
        count,
        settings.interval_s,
        settings.stale_after_s,
    )
    return Agent(
        node_name=parts.node_name,
        interval_s=settings.interval_s,
        backend=parts.backend,
        pods=parts.pods,
        reconciler=reconciler,
        hub=hub,
        loop=loop,
        cycle_thread=cycle_thread,
        shutdown_grace_s=settings.shutdown_grace_s,
        cleanups=parts.cleanups,
        pod_events=parts.pod_events,
        departure=parts.departure,
        observing=settings.mode is Mode.OBSERVE,
    )


def _both(
    first: Callable[[CycleReport], None] | None, second: Callable[[CycleReport], None] | None
) -> Callable[[CycleReport], None] | None:
    if first is None or second is None:
        return first or second

    def both(report: CycleReport) -> None:
        first(report)
        second(report)

    return both


def _uuids(backend: GpuBackend, count: int) -> dict[int, str | None]:
    """Every GPU's UUID at start, so consumers list them before the first cycle."""
    uuids: dict[int, str | None] = {}
    for index in range(count):
        try:
            uuids[index] = backend.uuid(index)
        except GpuError as exc:
            log.warning("uuid read failed at start gpu=%d error=%s", index, exc)
            uuids[index] = None
    return uuids


def _simulated(settings: AgentSettings) -> _Parts:
    scenario = load_settings_scenario(settings)
    limits = (
        None if settings.sim_limits_file is None else PersistentLimits(settings.sim_limits_file)
    )
    world = SimWorld(scenario, limits=limits)
    # The scenario's processes become real cgroup files so that the real
    # attribution code runs in simulation too.
    # Removed at stop, or by the next simulator if this process is SIGKILLed.
    scratch = ScratchDirectory("capwatch-sim-proc-")
    proc_root = scratch.path
    world.materialise_procs(proc_root)
    node_name = settings.node_name or scenario.node_name
    # The scenario's claims and slices, joined by the real agent's code (agent.dra.claims).
    claims = (
        SimClaimView(world, node=node_name, uuid_attribute=settings.dra_uuid_attribute)
        if settings.dra_claims
        else None
    )
    return _Parts(
        backend=SimGpuBackend(world),
        pods=SimPodView(world),
        proc_root=proc_root,
        node_name=node_name,
        listeners=(world,),
        cleanups=(scratch.close,),
        claims=claims,
    )


def _real(settings: AgentSettings, clock: Clock) -> _Parts:
    # Imported here so that the simulator (demo, tests) never loads NVML or the
    # Kubernetes client.
    from capwatch.agent.kube.claims import (  # noqa: PLC0415
        CLAIM_READ_TIMEOUT_S,
        RESOURCE_API,
        SLICES_PATH,
        NodeClaims,
    )
    from capwatch.agent.kube.departure import KubeDepartureCheck  # noqa: PLC0415
    from capwatch.agent.kube.pod_requests import (  # noqa: PLC0415
        KubernetesEventSink,
        KubernetesPodRequests,
    )
    from capwatch.agent.kube.podview import PodInformer  # noqa: PLC0415
    from capwatch.agent.nvml.backend import NvmlBackend  # noqa: PLC0415
    from capwatch.kube.client import (  # noqa: PLC0415
        CollectionRequests,
        ObjectRequests,
        api_transport,
        group_version_served,
    )
    from capwatch.kube.informer import WatchPolicy  # noqa: PLC0415

    assert settings.node_name is not None  # settings validation guarantees it
    backend = NvmlBackend.open()
    try:
        api = api_transport(
            None if settings.kubeconfig is None else str(settings.kubeconfig),
            user_agent=f"capwatch-agent/{settings.node_name}",
        )
        policy = WatchPolicy(
            stale_after=settings.interval_s, silence_bound=settings.pod_silence_bound_s
        )
        nudge = Nudge()  # a pod bound here, a claim allocated here: cap it before it runs
        view = PodInformer(
            node_name=settings.node_name,
            requests=KubernetesPodRequests(
                api, node_name=settings.node_name, namespace=settings.pod_namespace
            ),
            clock=clock,
            policy=policy,
            on_new_pod=nudge,
        )
        view.start()
        claims = None
        if settings.dra_claims:
            # This node's pods' claims, by name, and this node's slices: nothing
            # cluster-wide. Whether resource.k8s.io/v1 is served is asked now and again
            # later (a cluster upgraded while the agent runs needs no restart).
            claims = NodeClaims(
                node_name=settings.node_name,
                slices=CollectionRequests(
                    api, path=SLICES_PATH, field_selector=f"spec.nodeName={settings.node_name}"
                ),
                objects=ObjectRequests(api, timeout=min(CLAIM_READ_TIMEOUT_S, settings.interval_s)),
                served=lambda: group_version_served(
                    api, RESOURCE_API, timeout=min(CLAIM_READ_TIMEOUT_S, settings.interval_s)
                ),
                clock=clock,
                policy=policy,
                uuid_attribute=settings.dra_uuid_attribute,
                on_change=nudge,
            )
            claims.start()
    except Exception as exc:
        backend.close()
        if isinstance(exc, CapwatchError):
            raise
        raise PodViewError(f"cannot start the Kubernetes pod view: {exc}") from exc
    events = None
    if settings.pod_events:
        events = PodEvents(
            KubernetesEventSink(
                transport=api,
                node_name=settings.node_name,
                clock=clock,
                release=settings.release,
            ),
            annotation_key=settings.annotation_key,
        )
    closers = () if events is None else (events.close,)
    departure = None
    if settings.agent_pod_name is not None and settings.agent_pod_namespace is not None:
        departure = KubeDepartureCheck(
            ObjectRequests(api, timeout=DEPARTURE_READ_TIMEOUT_S),
            namespace=settings.agent_pod_namespace,
            pod_name=settings.agent_pod_name,
            node_name=settings.node_name,
        )
    return _Parts(
        backend=backend,
        pods=view,
        proc_root=settings.proc_root,
        node_name=settings.node_name,
        cleanups=closers if claims is None else (*closers, claims.close),
        pod_events=events,
        claims=claims,
        nudge=nudge,
        departure=departure,
    )
