"""One fault-injection interface over both GPU backends, so the loop contract is
tested identically on the simulator and on the real NVML backend (the real
``pynvml`` over the fake ``libnvidia-ml.so.1``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Protocol

from capwatch.agent.gpus import GpuBackend, GpuErrorClass, WriteOutcome
from capwatch.agent.reconciling import CycleListener
from capwatch.agent.sim.proctree import ProcSpec, materialise
from capwatch.agent.sim.scenario import FaultOp, FaultSpec, parse_scenario
from capwatch.agent.sim.views import SimGpuBackend
from capwatch.agent.sim.world import SimWorld
from tests.fakenvml.control import FakeDevice, FakeNvml

GPU_COUNT = 3
MIN_W, MAX_W, DEFAULT_W = 100, 400, 300
UUIDS = tuple(f"GPU-c0c0c0c0-0000-4000-8000-{i:012x}" for i in range(GPU_COUNT))


class Op(str, Enum):
    DEVICE_COUNT = "device_count"
    UUID = "uuid"
    PROCESSES = "processes"
    CONSTRAINTS = "constraints"
    SET_LIMIT = "set_limit"
    RESTORE = "restore"


@dataclass(frozen=True, kw_only=True)
class Write:
    """A power-limit write that reached the device (whatever its result)."""

    index: int
    milliwatts: int
    ok: bool


class Rig(Protocol):
    name: str
    backend: GpuBackend
    listeners: tuple[CycleListener, ...]

    def run(self, index: int, processes: Mapping[int, str | None]) -> None:
        """GPU ``index`` now runs exactly these processes (pid -> pod uid or None)."""

    def fail(self, op: Op, index: int | None, error: GpuErrorClass) -> None:
        """From now on ``op`` (on GPU ``index``) fails with ``error``."""

    def change_uuid_before_write(self, index: int, new_uuid: str) -> None:
        """GPU ``index`` is re-enumerated between its step's UUID read and the write."""

    def clear_faults(self) -> None: ...

    def writes(self) -> list[Write]: ...

    def limit_mw(self, index: int) -> int: ...


def _procs(root: Path, processes: Mapping[int, str | None]) -> None:
    materialise(root, [ProcSpec(pid=pid, pod_uid=uid) for pid, uid in processes.items()])


class SimRig:
    name = "sim"

    def __init__(self, proc_root: Path) -> None:
        scenario = parse_scenario(
            {
                "node_name": "rig",
                "safe_default_watts": 250,
                "gpus": [
                    {"uuid": u, "min_watts": MIN_W, "max_watts": MAX_W, "default_watts": DEFAULT_W}
                    for u in UUIDS
                ],
            },
            source="rig",
        )
        self.world = SimWorld(scenario)
        self.world.materialise_procs(proc_root)
        self.backend: GpuBackend = SimGpuBackend(self.world)
        self.listeners: tuple[CycleListener, ...] = (self.world,)

    def run(self, index: int, processes: Mapping[int, str | None]) -> None:
        self.world.set_processes(index, dict(processes))

    def fail(self, op: Op, index: int | None, error: GpuErrorClass) -> None:
        self.world.add_fault(FaultSpec(op=FaultOp(op.value), gpu=index, error=error))

    def change_uuid_before_write(self, index: int, new_uuid: str) -> None:
        self.world.add_fault(
            FaultSpec(op=FaultOp.UUID, gpu=index, change_to=new_uuid, identity_check_only=True)
        )

    def clear_faults(self) -> None:
        self.world.clear_faults()

    def writes(self) -> list[Write]:
        refused = (WriteOutcome.IDENTITY_MISMATCH, WriteOutcome.IDENTITY_UNCONFIRMED)
        return [
            Write(index=w.index, milliwatts=w.milliwatts, ok=w.outcome is WriteOutcome.OK)
            for w in self.world.writes()
            if w.outcome not in refused
        ]

    def limit_mw(self, index: int) -> int:
        return self.world.limit_milliwatts(index)


# Which NVML entry points carry each operation.
_NVML_FUNCTIONS: Mapping[Op, Sequence[str]] = {
    Op.DEVICE_COUNT: ("nvmlDeviceGetCount",),
    Op.UUID: ("nvmlDeviceGetUUID",),
    Op.PROCESSES: ("nvmlDeviceGetComputeRunningProcesses",),
    Op.CONSTRAINTS: ("nvmlDeviceGetPowerManagementLimitConstraints",),
    Op.SET_LIMIT: ("nvmlDeviceSetPowerManagementLimit",),
    # A restore reads the default and writes it; failing the write is the fault
    # that matters (the rig only restores on idle GPUs, which get no set_limit).
    Op.RESTORE: ("nvmlDeviceSetPowerManagementLimit",),
}


class NvmlRig:
    name = "nvml"

    def __init__(self, fake: FakeNvml, proc_root: Path) -> None:
        from capwatch.agent.nvml.backend import NvmlBackend
        from tests.fakenvml.fixtures import FIXTURE_EVENT_WAIT_MS

        self.fake = fake
        self.proc_root = proc_root
        fake.configure(
            [
                FakeDevice(
                    uuid=u,
                    min_milliwatts=MIN_W * 1000,
                    max_milliwatts=MAX_W * 1000,
                    default_milliwatts=DEFAULT_W * 1000,
                )
                for u in UUIDS
            ]
        )
        proc_root.mkdir(parents=True, exist_ok=True)
        self.backend: GpuBackend = NvmlBackend.open(event_wait_ms=FIXTURE_EVENT_WAIT_MS)
        self.listeners: tuple[CycleListener, ...] = ()

    def run(self, index: int, processes: Mapping[int, str | None]) -> None:
        _procs(self.proc_root, processes)
        self.fake.set_processes(index, list(processes))

    def fail(self, op: Op, index: int | None, error: GpuErrorClass) -> None:
        code = "NVML_ERROR_" + error.value.upper()
        for function in _NVML_FUNCTIONS[op]:
            self.fake.inject(function, index, code)

    def change_uuid_before_write(self, index: int, new_uuid: str) -> None:
        # The step reads the UUID once; the write's identity check is the next read.
        self.fake.change_uuid(index, new_uuid, after_calls=1)

    def clear_faults(self) -> None:
        self.fake.clear_faults()

    def writes(self) -> list[Write]:
        return [
            Write(index=e.device, milliwatts=e.milliwatts, ok=e.rc == 0)
            for e in self.fake.write_log()
        ]

    def limit_mw(self, index: int) -> int:
        return self.fake.limit(index)
