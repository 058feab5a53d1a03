"""The simulated node: a scenario-driven GPU backend and pod view.

:class:`SimWorld` holds the state of one simulated node (the scenario, the
current cycle, each GPU's power limit, a log of every write, the active
faults); :class:`SimGpuBackend` and :class:`SimPodView` implement the agent's
:class:`~capwatch.agent.gpus.GpuBackend` and :class:`~capwatch.agent.pods.PodView` over it. The
world is also a cycle listener: the reconcile loop calls
:meth:`SimWorld.begin_cycle` at the start of every cycle, which is what
scenario ``cycles`` ranges are counted in (and when the scenario's device faults
start, fire and end: ``agent.sim.faults``), and :meth:`SimWorld.interrupt` at
shutdown, which cuts every simulated hang short.

Everything is deterministic: the same scenario and the same call sequence give
the same results. The only real-time behaviour is a ``hang`` fault, which
sleeps its duration (interruptibly, on :attr:`SimWorld.stop`) and then lets the
call proceed as if it had not hung; once ``stop`` is set hangs return at once.

Tests change the world at run time with a few small methods:

- ``add_fault(FaultSpec(op=FaultOp.SET_LIMIT, gpu=0, error=GpuErrorClass.NO_PERMISSION))``
  fails every later ``set_limit`` on GPU 0 (a fault without ``cycles`` is always
  active); ``clear_faults()`` removes every fault, the scenario's included;
- ``set_processes(1, {4242: pod_uid})`` makes GPU 1 run exactly pid 4242 of that
  pod from now on, whatever the cycle (``None`` as the uid: not a Kubernetes
  process), and writes its cgroup file if a proc tree was materialised;
- ``add_pod(PodSpec(...))`` / ``remove_pod(uid)`` change what the pod view sees.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

from capwatch.agent.gpus import GpuError, GpuErrorClass, WriteOutcome, WriteResult
from capwatch.agent.health.telemetry import Readings
from capwatch.agent.pods import PodSnapshot
from capwatch.agent.sim.devices import SimDevices
from capwatch.agent.sim.faults import DeviceFaultSchedule
from capwatch.agent.sim.limits import PersistentLimits
from capwatch.agent.sim.proctree import CgroupLayout, ProcSpec, QosClass, cgroup_text, materialise
from capwatch.agent.sim.scenario import FaultOp, FaultSpec, GpuSpec, PodSpec, ProcessSpec, Scenario
from capwatch.kit.errors import ConfigError, ScenarioError

log = logging.getLogger(__name__)

MW_PER_WATT = 1000


class WriteKind(str, Enum):
    SET = "set"
    RESTORE = "restore"


@dataclass(frozen=True, kw_only=True)
class SimWrite:
    """One attempted power-limit write, whatever its outcome."""

    cycle: int
    index: int
    uuid: str  # the UUID the caller bound the write to
    milliwatts: int  # requested (for a restore: the device's default)
    kind: WriteKind
    outcome: WriteOutcome
    error_class: GpuErrorClass | None = None


class SimWorld:
    """The state of one simulated node, shared by its backend and pod view. Thread-safe."""

    def __init__(
        self,
        scenario: Scenario,
        *,
        limits: PersistentLimits | None = None,
        write_log: int | None = None,
    ) -> None:
        """``limits``: keep the power limits in a file that outlives the process (crash
        trials); raises ConfigError if that file cannot be read. ``write_log``: how many
        writes :meth:`writes` keeps, the latest (None: every one; a long-running pool's
        nodes keep a few)."""
        self._scenario = scenario
        self._lock = threading.Lock()
        self.stop = threading.Event()  # set by interrupt(): hangs end at once
        self._cycle = 0
        self._generation = 0  # bumped on every change the pod view can see
        self._persisted = limits
        kept = {} if limits is None else limits.load()
        self._limits_mw = [kept.get(g.uuid, g.default_watts * MW_PER_WATT) for g in scenario.gpus]
        self._writes: deque[SimWrite] = deque(maxlen=write_log)
        self._faults: list[FaultSpec] = list(scenario.faults)
        self._pods: list[PodSpec] = list(scenario.pods)
        self._processes: dict[int, tuple[ProcessSpec, ...]] = {
            i: tuple(p for p in scenario.processes if p.gpu == i) for i in range(len(scenario.gpus))
        }
        self._proc_root: Path | None = None
        self.devices = SimDevices(count=len(scenario.gpus))  # their own health and telemetry
        self._device_faults = DeviceFaultSchedule(
            scenario.device_faults, devices=self.devices, uuids=[g.uuid for g in scenario.gpus]
        )
        self._device_faults.hold(0)  # start-up is cycle 0: faults without cycles hold already

    @property
    def scenario(self) -> Scenario:
        return self._scenario

    @property
    def cycle(self) -> int:
        with self._lock:
            return self._cycle

    @property
    def proc_root(self) -> Path | None:
        """The directory :meth:`materialise_procs` wrote, or None before it ran."""
        with self._lock:
            return self._proc_root

    # --- cycle listener ------------------------------------------------------------------

    def begin_cycle(self, sequence: int) -> None:
        """Make ``sequence`` the current cycle (the loop calls this as each cycle starts),
        and apply the scenario's device faults for it (agent.sim.faults)."""
        if sequence < 0:
            raise ValueError(f"cycle sequence must be >= 0, got {sequence}")
        with self._lock:
            self._cycle = sequence
            self._generation += 1
        self._device_faults.begin_cycle(sequence)
        log.debug("sim cycle begins cycle=%d", sequence)

    def interrupt(self) -> None:
        """End every current and future simulated hang at once (shutdown)."""
        self.stop.set()

    # --- inspection ------------------------------------------------------------------------

    def limit_milliwatts(self, index: int) -> int:
        """The power limit GPU ``index`` carries now."""
        with self._lock:
            return self._limits_mw[index]

    def writes(self) -> tuple[SimWrite, ...]:
        """Every write attempted so far (the latest ``write_log``), oldest first."""
        with self._lock:
            return tuple(self._writes)

    # --- the proc tree ---------------------------------------------------------------------

    def read_cgroup(self, pid: int) -> str | None:
        """``/proc/<pid>/cgroup`` of a scenario process, computed rather than read: the
        world is then its own :class:`~capwatch.agent.attribution.ProcRoot` (a pool's thousands
        of nodes need no files)."""
        with self._lock:
            spec = next(
                (p for procs in self._processes.values() for p in procs if p.pid == pid), None
            )
        return None if spec is None else cgroup_text(_proc_spec(spec))

    def materialise_procs(self, root: Path) -> None:
        """Write ``<root>/<pid>/cgroup`` for every process, and remember ``root``.

        Every process of the scenario is written, whatever its ``cycles``; a
        process added later by :meth:`set_processes` is written there too.
        """
        root.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._proc_root = root
            specs = [_proc_spec(p) for procs in self._processes.values() for p in procs]
            materialise(root, specs)
        log.info("sim proc tree written root=%s processes=%d", root, len(specs))

    # --- runtime mutation (tests) ----------------------------------------------------------

    def add_fault(self, fault: FaultSpec) -> None:
        """Inject ``fault`` from now on (within its ``cycles``). Raises ScenarioError."""
        if fault.gpu is not None:
            self._check_gpu(fault.gpu, "add_fault.gpu")
        with self._lock:
            self._faults.append(fault)

    def clear_faults(self) -> None:
        """Remove every fault, the scenario's included."""
        with self._lock:
            self._faults.clear()

    def set_processes(
        self,
        gpu: int,
        processes: Mapping[int, str | None],
        *,
        qos: QosClass = QosClass.BURSTABLE,
        cgroup_layout: CgroupLayout = CgroupLayout.V2_SYSTEMD_CONTAINERD,
    ) -> None:
        """From now on GPU ``gpu`` runs exactly ``processes`` (pid -> pod uid or None).

        The processes exist in every cycle. A pod uid need not be in the pod
        view (that is how a process outliving its pod, or a lagging view,
        looks). Raises ScenarioError for a bad GPU index or pid.
        """
        self._check_gpu(gpu, "set_processes.gpu")
        specs = tuple(
            ProcessSpec(gpu=gpu, pid=pid, pod=uid, qos=qos, cgroup_layout=cgroup_layout)
            for pid, uid in processes.items()
        )
        try:
            procs = [_proc_spec(p) for p in specs]
        except ConfigError as exc:  # a pid or pod uid no real node produces
            raise ScenarioError(f"set_processes.{exc.option}", exc.reason) from exc
        with self._lock:
            self._processes[gpu] = specs
            if self._proc_root is not None:
                materialise(self._proc_root, procs)
        log.info("sim processes set gpu=%d pids=%s", gpu, sorted(processes))

    def add_pod(self, pod: PodSpec) -> None:
        """Add a pod to the pod view (within its ``cycles``). Raises ScenarioError."""
        with self._lock:
            if any(p.uid == pod.uid for p in self._pods):
                raise ScenarioError("add_pod.uid", f"a pod with uid {pod.uid!r} already exists")
            self._pods.append(pod)
            self._generation += 1

    def remove_pod(self, uid: str) -> None:
        """Remove a pod from the pod view (its processes keep running). Raises ScenarioError."""
        with self._lock:
            kept = [p for p in self._pods if p.uid != uid]
            if len(kept) == len(self._pods):
                raise ScenarioError("remove_pod.uid", f"no pod with uid {uid!r}")
            self._pods = kept
            self._generation += 1

    # --- used by SimGpuBackend and SimPodView --------------------------------------------

    def _check_gpu(self, gpu: int, option: str) -> None:
        if not 0 <= gpu < len(self._scenario.gpus):
            raise ScenarioError(
                option, f"no GPU at index {gpu}; the scenario has {len(self._scenario.gpus)}"
            )

    def _gpu(self, index: int) -> GpuSpec:
        """The GPU at ``index``, or the GpuError NVML gives for a bad index."""
        if not 0 <= index < len(self._scenario.gpus):
            raise GpuError(
                f"no simulated GPU at index {index}", error_class=GpuErrorClass.INVALID_ARGUMENT
            )
        return self._scenario.gpus[index]

    def _enter(
        self, op: FaultOp, gpu: int | None, *, identity_check: bool = False
    ) -> FaultSpec | None:
        """Sleep through the active hangs of ``op`` on ``gpu``; return its error/change fault.

        Errors take precedence over ``change_to``; among equals the first added
        wins. ``identity_check_only`` faults apply only when ``identity_check``.
        """
        with self._lock:
            cycle = self._cycle
            active = [
                f
                for f in self._faults
                if f.op is op
                and f.gpu == gpu
                and f.cycles.contains(cycle)
                and (identity_check or not f.identity_check_only)
            ]
        for fault in active:
            if fault.hang_seconds is not None:
                log.info(
                    "sim fault hang op=%s gpu=%s cycle=%d seconds=%s",
                    op.value,
                    gpu,
                    cycle,
                    fault.hang_seconds,
                )
                self.stop.wait(fault.hang_seconds)
        errors = [f for f in active if f.error is not None]
        changes = [f for f in active if f.change_to is not None]
        return next(iter(errors + changes), None)

    def _current_uuid(self, index: int, *, identity_check: bool) -> str:
        """The UUID the device at ``index`` reports now. Raises GpuError."""
        gpu = self._gpu(index)
        fault = self._enter(FaultOp.UUID, index, identity_check=identity_check)
        if fault is not None and fault.error is not None:
            raise fault_error(fault, self.cycle)
        if fault is not None and fault.change_to is not None:
            return fault.change_to
        return gpu.uuid

    def _processes_now(self, index: int) -> tuple[int, ...]:
        with self._lock:
            return tuple(p.pid for p in self._processes[index] if p.cycles.contains(self._cycle))

    def _write(self, op: FaultOp, index: int, uuid: str, milliwatts: int | None) -> WriteResult:
        """One identity-bound write, logged whatever its outcome; None restores the default."""
        cycle = self.cycle
        if milliwatts is None and 0 <= index < len(self._scenario.gpus):
            milliwatts = self._scenario.gpus[index].default_watts * MW_PER_WATT
        requested = 0 if milliwatts is None else milliwatts
        result = self._attempt(op, index, uuid, requested)
        with self._lock:
            if result.ok:
                result = self._set_limit(index, requested, result)
            self._writes.append(
                SimWrite(
                    cycle=cycle,
                    index=index,
                    uuid=uuid,
                    milliwatts=requested,
                    kind=WriteKind.SET if op is FaultOp.SET_LIMIT else WriteKind.RESTORE,
                    outcome=result.outcome,
                    error_class=result.error_class,
                )
            )
        log.debug(
            "sim write op=%s cycle=%d index=%d uuid=%s milliwatts=%d outcome=%s error=%s",
            op.value,
            cycle,
            index,
            uuid,
            requested,
            result.outcome.value,
            result.error_class.value if result.error_class else "-",
        )
        return result

    def _set_limit(self, index: int, milliwatts: int, result: WriteResult) -> WriteResult:
        """Make the limit the device's (on disk first when persisted); under the lock."""
        if self._persisted is not None:
            limits = {
                g.uuid: mw for g, mw in zip(self._scenario.gpus, self._limits_mw, strict=True)
            }
            limits[self._scenario.gpus[index].uuid] = milliwatts
            try:
                self._persisted.save(limits)
            except OSError as exc:
                return WriteResult(
                    outcome=WriteOutcome.FAILED,
                    error_class=GpuErrorClass.UNKNOWN,
                    detail=f"simulated limit not persisted: {exc}",
                )
        self._limits_mw[index] = milliwatts
        return result

    def _attempt(self, op: FaultOp, index: int, uuid: str, milliwatts: int) -> WriteResult:
        """What NVML would answer: identity re-read, then the write's own faults and range."""
        try:
            gpu = self._gpu(index)
            check_present(self, index)
            actual = self._current_uuid(index, identity_check=True)
        except GpuError as exc:
            return WriteResult(
                outcome=WriteOutcome.IDENTITY_UNCONFIRMED,
                error_class=exc.error_class,
                detail=f"identity read failed: {exc}",
            )
        if actual != uuid:
            return WriteResult(
                outcome=WriteOutcome.IDENTITY_MISMATCH,
                detail=f"device at index {index} is {actual}, not {uuid}",
            )
        fault = self._enter(op, index)
        if fault is not None and fault.error is not None:
            return WriteResult(
                outcome=WriteOutcome.FAILED,
                error_class=fault.error,
                detail=f"simulated {op.value} fault: {fault.error.value}",
            )
        low, high = gpu.min_watts * MW_PER_WATT, gpu.max_watts * MW_PER_WATT
        if not low <= milliwatts <= high:  # NVML answers INVALID_ARGUMENT
            return WriteResult(
                outcome=WriteOutcome.FAILED,
                error_class=GpuErrorClass.INVALID_ARGUMENT,
                detail=f"{milliwatts} mW is outside [{low}, {high}] mW",
            )
        return WriteResult(outcome=WriteOutcome.OK, applied_milliwatts=milliwatts)

    def readings(self, index: int) -> Readings:
        """This cycle's device reads of GPU ``index`` (see agent.sim.devices)."""
        gpu = self._gpu(index)
        busy = bool(self._processes_now(index))
        with self._lock:
            limit = self._limits_mw[index]
        return self.devices.readings(
            index,
            limit_mw=limit,
            default_mw=gpu.default_watts * MW_PER_WATT,
            max_mw=gpu.max_watts * MW_PER_WATT,
            busy=busy,
        )

    def _pods_now(self) -> PodSnapshot:
        with self._lock:
            # A pod uses the claims reserved for it while they are allocated, as a real
            # pod names the claims its spec and status list.
            claims: dict[str, list[str]] = {}
            for claim in self.scenario.claims:
                if claim.cycles.contains(self._cycle):
                    for pod in claim.reserved_for:
                        claims.setdefault(pod.uid, []).append(claim.name)
            pods = {
                p.uid: replace(p.info(), claims=tuple(sorted(claims.get(p.uid, ()))))
                for p in self._pods
                if p.cycles.contains(self._cycle)
            }
            return PodSnapshot(pods=pods, resource_version=str(self._generation))


def _proc_spec(process: ProcessSpec) -> ProcSpec:
    return ProcSpec(
        pid=process.pid, pod_uid=process.pod, qos=process.qos, layout=process.cgroup_layout
    )


def fault_error(fault: FaultSpec, cycle: int) -> GpuError:
    assert fault.error is not None
    where = "" if fault.gpu is None else f" on gpu {fault.gpu}"
    return GpuError(
        f"simulated {fault.op.value} fault{where} at cycle {cycle}: {fault.error.value}",
        error_class=fault.error,
    )


def check_present(world: SimWorld, index: int) -> None:
    """A lost GPU answers every call as NVML does: "GPU is lost"."""
    if world.devices.is_lost(index):
        raise GpuError(f"simulated GPU {index} is lost", error_class=GpuErrorClass.GPU_IS_LOST)
