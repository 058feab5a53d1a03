"""A KWOK node with NVIDIA's driver's ResourceSlice, and a real capwatch agent there.

:func:`dra_node` makes the node and its slice; :func:`start_dra_agent` starts its agent
on the fake NVML (with device events already queued, for a fault from its first
cycle); :func:`start_dra_node` does both. The fake NVML lists the GPUs in the reverse
of the slice's order, so that a GPU's NVML index is not its slice name's number: only
the UUID joins the two.
"""

from __future__ import annotations

import contextlib
import uuid as uuid_module
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.controller.e2e.processes import Process, wait_until
from tests.fakenvml.control import FakeConfig, FakeDevice, QueuedEvent, read_log_file
from tests.realkube.access import BoundPod
from tests.realkube.components import Scene
from tests.realkube.dra import (
    GPU_DRIVER,
    AgentStream,
    gpu_uuid,
    kwok_node,
    node_ready,
    publish_slice,
)

SAFE_DEFAULT_W = 300  # the chart's --safe-default-watts
MIN_MW, MAX_MW, DEFAULT_MW = 200_000, 700_000, 700_000  # an H100's settable range


@dataclass(kw_only=True)
class DraNode:
    """A node KWOK keeps Ready, the GPU driver's ResourceSlice of it, and a real agent there
    on the fake NVML, as the agent's ServiceAccount (its token bound to its pod)."""

    scene: Scene
    name: str
    devices: dict[str, str]  # the slice's device name -> UUID
    nvml: list[str]  # the UUIDs in NVML index order (not the slice's)
    process: Process
    log_file: Path
    address: str

    def writes(self, uuid: str) -> list[int]:
        """The milliwatts of every successful limit write to ``uuid``, in order."""
        if not self.log_file.exists():
            return []
        return [e.milliwatts for e in read_log_file(self.log_file) if e.rc == 0 and e.uuid == uuid]

    def device_of(self, allocated: tuple[str, str, str]) -> str:
        """The UUID of an allocated (driver, pool, device), by this node's slice."""
        driver, pool, device = allocated
        assert (driver, pool) == (GPU_DRIVER, self.name), allocated
        return self.devices[device]

    @contextlib.contextmanager
    def stream(self) -> Iterator[AgentStream]:
        """The agent's stream, once it shows every GPU idle (nothing asked of any yet)."""
        with AgentStream(address=self.address, node=self.name) as stream:
            stream.wait_idle(list(self.devices.values()))
            yield stream


@dataclass(frozen=True, kw_only=True)
class NodeWithSlice:
    """A KWOK node and its driver's slice, before its agent runs."""

    name: str
    tag: str
    devices: dict[str, str]  # the slice's device name -> UUID
    nvml: list[str]  # the UUIDs in NVML index order (the slice's, reversed)

    def nvml_index(self, device: str) -> int:
        """The NVML index of the GPU the slice names ``device``."""
        return self.nvml.index(self.devices[device])


def dra_node(scene: Scene, *, gpus: int = 2) -> NodeWithSlice:
    """A fresh KWOK node with ``gpus`` GPUs in its slice (``gpu-0``... as the driver names
    them), Ready."""
    tag = uuid_module.uuid4().hex[:8]
    name = f"dra-{tag}"
    node = kwok_node(scene.plane, name)
    scene.nodes.append(name)
    devices = {f"gpu-{i}": gpu_uuid(tag, i) for i in range(gpus)}
    scene.paths.append(publish_slice(scene.plane, node, devices))
    wait_until(lambda: node_ready(scene.plane, name), timeout=60, what=f"{name} Ready")
    return NodeWithSlice(name=name, tag=tag, devices=devices, nvml=list(reversed(devices.values())))


def start_dra_node(scene: Scene, *, gpus: int = 2) -> DraNode:
    """:func:`dra_node` and its agent (:func:`start_dra_agent`); no process on any GPU."""
    return start_dra_agent(scene, dra_node(scene, gpus=gpus))


def start_dra_agent(
    scene: Scene, made: NodeWithSlice, *, events: Sequence[QueuedEvent] = ()
) -> DraNode:
    """The node's agent, once it has completed its first cycle; ``events`` are queued in
    its fake NVML before it starts (an XID there is a fault from its first cycles). The
    agent's pod (the DaemonSet's labels and account) is KWOK's to run, as any pod on the
    node."""
    name, tag, devices, nvml = made.name, made.tag, made.devices, made.nvml
    directory = scene.directory / f"agent-{name}"
    (directory / "proc").mkdir(parents=True)
    log_file = directory / "nvml-writes.log"
    fake = FakeConfig(
        devices=tuple(
            FakeDevice(
                uuid=u, min_milliwatts=MIN_MW, max_milliwatts=MAX_MW, default_milliwatts=DEFAULT_MW
            )
            for u in nvml
        ),
        log_file=log_file,
        events=tuple(events),
    ).write(directory / "fake-nvml.conf")
    own = scene.pod(
        f"{scene.release.name}-{tag[:5]}",
        name,
        labels=scene.release.pod_labels("DaemonSet"),
        account=scene.release.service_account("agent"),
    )
    config = scene.kubeconfig(
        "agent", pod=BoundPod(own["metadata"]["name"], own["metadata"]["uid"])
    )
    process = scene.agent(own, kubeconfig=config, nvml_config=fake, proc_root=directory / "proc")
    address = process.wait_log(r"grpc serving addresses=(\S+)")[1]
    process.wait_log(r"cycle seq=1 ")
    return DraNode(
        scene=scene,
        name=name,
        devices=devices,
        nvml=nvml,
        process=process,
        log_file=log_file,
        address=address,
    )
