"""The agent's interfaces over a simulated node: its GPU backend and its pod view.

:class:`SimGpuBackend` implements :class:`~capwatch.agent.gpus.GpuBackend` and
:class:`SimPodView` implements :class:`~capwatch.agent.pods.PodView`, both over one
:class:`~capwatch.agent.sim.world.SimWorld`, which holds the state and the faults.
"""

from __future__ import annotations

from capwatch.agent.gpus import GpuError, GpuErrorClass, PowerConstraints, WriteOutcome, WriteResult
from capwatch.agent.health.telemetry import NO_READINGS, DeviceEvent, Readings
from capwatch.agent.pods import PodSnapshot
from capwatch.agent.sim.scenario import FaultOp
from capwatch.agent.sim.world import MW_PER_WATT, SimWorld, check_present, fault_error
from capwatch.kit.errors import PodViewError


class SimGpuBackend:
    """A :class:`~capwatch.agent.gpus.GpuBackend` over a :class:`SimWorld` (milliwatts
    throughout)."""

    def __init__(self, world: SimWorld) -> None:
        self._world = world
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:  # as NVML after nvmlShutdown
            raise GpuError("simulated backend is closed", error_class=GpuErrorClass.UNINITIALIZED)

    def _read(self, op: FaultOp, index: int | None) -> None:
        self._check_open()
        if index is not None:
            self._world._gpu(index)
            check_present(self._world, index)
        fault = self._world._enter(op, index)
        if fault is not None and fault.error is not None:
            raise fault_error(fault, self._world.cycle)

    def device_count(self) -> int:
        self._read(FaultOp.DEVICE_COUNT, None)
        return len(self._world.scenario.gpus)

    def uuid(self, index: int) -> str:
        self._check_open()
        check_present(self._world, index)
        return self._world._current_uuid(index, identity_check=False)

    def constraints(self, index: int) -> PowerConstraints:
        self._read(FaultOp.CONSTRAINTS, index)
        gpu = self._world._gpu(index)
        return PowerConstraints(
            min_milliwatts=gpu.min_watts * MW_PER_WATT,
            max_milliwatts=gpu.max_watts * MW_PER_WATT,
            default_milliwatts=gpu.default_watts * MW_PER_WATT,
        )

    def processes(self, index: int) -> tuple[int, ...]:
        self._read(FaultOp.PROCESSES, index)
        return self._world._processes_now(index)

    def set_limit(self, index: int, *, uuid: str, milliwatts: int) -> WriteResult:
        if self._closed:
            return _closed_result()
        return self._world._write(FaultOp.SET_LIMIT, index, uuid, milliwatts)

    def restore_default(self, index: int, *, uuid: str) -> WriteResult:
        if self._closed:
            return _closed_result()
        return self._world._write(FaultOp.RESTORE, index, uuid, None)

    def readings(self, index: int) -> Readings:
        if self._closed:
            return NO_READINGS
        try:
            return self._world.readings(index)
        except GpuError:
            return NO_READINGS

    def drain_events(self) -> tuple[DeviceEvent, ...]:
        return self._world.devices.events.drain()

    def events_dropped_total(self) -> int:
        return self._world.devices.events.dropped_total

    def close(self) -> None:
        self._closed = True


def _closed_result() -> WriteResult:
    return WriteResult(
        outcome=WriteOutcome.IDENTITY_UNCONFIRMED,
        error_class=GpuErrorClass.UNINITIALIZED,
        detail="simulated backend is closed",
    )


class SimPodView:
    """A :class:`~capwatch.agent.pods.PodView` over a :class:`SimWorld`: the pods of the
    current cycle.

    A ``pod_view`` error fault raises PodViewError; a hang fault delays the
    snapshot. ``resource_version`` changes whenever the answer may have.
    """

    def __init__(self, world: SimWorld) -> None:
        self._world = world
        self._closed = False

    def snapshot(self) -> PodSnapshot:
        if self._closed:
            raise PodViewError("simulated pod view is closed")
        fault = self._world._enter(FaultOp.POD_VIEW, None)
        if fault is not None and fault.error is not None:
            raise PodViewError(
                f"simulated pod view fault at cycle {self._world.cycle}: {fault.error.value}"
            )
        return self._world._pods_now()

    def close(self) -> None:
        self._closed = True
