"""DRA on the real API server: the objects NVIDIA's GPU driver and its users make, and what
a capwatch agent streams about them.

What the driver (sigs.k8s.io/dra-driver-nvidia-gpu, ``cmd/gpu-kubelet-plugin``) publishes,
as its kubelet plugin does through k8s.io/dynamic-resource-allocation's ResourceSlice
controller: one ResourceSlice per node, driver ``gpu.nvidia.com``, pool named after the
node, owned by the Node, generateName ``<index>-<driver>-<node>-``; each full GPU a device
``gpu-<minor>`` (the minor number, not the NVML index) with the attributes of its
``GpuInfo.Attributes()`` (``type: gpu``, ``uuid``, ``productName``, ``brand``,
``architecture``, the CUDA and driver versions, ``resource.kubernetes.io/pciBusID``) and
``memory`` capacity. (Releases before September 2025 also had ``index`` and ``minor``
attributes; commit 36fc80ab removed them.) Its chart's DeviceClass ``gpu.nvidia.com``
selects ``device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type ==
'gpu'``.

What a user writes: a ResourceClaim (or a ResourceClaimTemplate) whose requests name that
class, with capwatch's opaque config; a pod that uses it. The real kube-scheduler then
allocates the claim (``status.allocation``, ``status.reservedFor``) and binds the pod; no
test writes an allocation here.

:class:`AgentStream` follows an agent's capwatch.v1 Watch on a thread and keeps every
cycle's per-GPU statuses; :func:`dra_devices` reads its DRA resource-health mirror once.
The node and its agent are tests/realkube/dra_node.py's.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.api.gen.capwatch.v1 import node_health_pb2_grpc as pb_grpc
from capwatch.api.gen.v1 import dra_health_pb2 as dra_pb
from capwatch.api.gen.v1 import dra_health_pb2_grpc as dra_grpc
from capwatch.server.grpc.nodes import NODE_METADATA_KEY
from tests.controller.e2e.processes import wait_until
from tests.realkube.access import ApiAccess, ApiError
from tests.realkube.flags import KWOK_NODE_SELECTOR

RESOURCE = "/apis/resource.k8s.io/v1"
GPU_DRIVER = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
CAPWATCH_DRIVER = "capwatch.io"
POWER_CAP_VERSION = "capwatch.io/v1alpha1"
# A label of the test's own pins a claim's pod to the test's node (the scheduler still
# chooses the devices, allocates the claim and binds the pod).
NODE_LABEL = "capwatch.test/node"
H100 = {"productName": "NVIDIA H100 80GB HBM3", "architecture": "Hopper", "memory": "80Gi"}


def gpu_uuid(tag: str, n: int) -> str:
    """A UUID in NVML's form, ``tag`` (hex) telling one test's GPUs from another's."""
    return f"GPU-{tag[:8]:0>8}-0000-4000-8000-{n:012x}"


# --- what the GPU driver publishes ----------------------------------------------------------


def device_class() -> dict[str, Any]:
    """The DeviceClass NVIDIA's chart installs for full GPUs."""
    expression = (
        f"device.driver == '{GPU_DRIVER}' && device.attributes['{GPU_DRIVER}'].type == 'gpu'"
    )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": GPU_CLASS},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def ensure_device_class(plane: ApiAccess) -> None:
    """Create the DeviceClass unless it exists (it is cluster-scoped: one per server)."""
    try:
        plane.request("POST", f"{RESOURCE}/deviceclasses", device_class())
    except ApiError as err:
        if err.status != 409:
            raise


def gpu_device(name: str, uuid: str, bus: int) -> dict[str, Any]:
    """One full GPU as the driver's ``GpuInfo.GetDevice()`` announces it."""
    return {
        "name": name,
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": uuid},
            "productName": {"string": H100["productName"]},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": H100["architecture"]},
            "cudaComputeCapability": {"version": "9.0.0"},
            "driverVersion": {"version": "570.124.6"},
            "cudaDriverVersion": {"version": "12.8.0"},
            "resource.kubernetes.io/pciBusID": {"string": f"0000:{bus:02x}:00.0"},
        },
        "capacity": {"memory": {"value": H100["memory"]}},
    }


def resource_slice(node: Mapping[str, Any], devices: Mapping[str, str]) -> dict[str, Any]:
    """The driver's ResourceSlice of ``node``: ``devices`` maps device name -> UUID."""
    name, uid = node["metadata"]["name"], node["metadata"]["uid"]
    owner = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid, "controller": True}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"0-{GPU_DRIVER}-{name}-", "ownerReferences": [owner]},
        "spec": {
            "driver": GPU_DRIVER,
            "nodeName": name,
            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                gpu_device(device, uuid, 0x1B + 0x10 * i)
                for i, (device, uuid) in enumerate(devices.items())
            ],
        },
    }


def publish_slice(plane: ApiAccess, node: Mapping[str, Any], devices: Mapping[str, str]) -> str:
    """Create the node's ResourceSlice as admin (the driver's kubelet plugin would); its path."""
    made = plane.request("POST", f"{RESOURCE}/resourceslices", resource_slice(node, devices))
    return f"{RESOURCE}/resourceslices/{made['metadata']['name']}"


def kwok_node(plane: ApiAccess, name: str) -> dict[str, Any]:
    """A Node KWOK keeps Ready (its annotation), with the label claim pods select it by."""
    key, value = KWOK_NODE_SELECTOR.split("=")
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": {key: value}, "labels": {NODE_LABEL: name}},
    }
    made: dict[str, Any] = plane.request("POST", "/api/v1/nodes", body)
    return made


def schedulable_node(plane: ApiAccess, name: str) -> dict[str, Any]:
    """A Node with no kubelet or KWOK behind it that the scheduler places pods on: its
    status as a kubelet reports it (Ready, room for pods), and without the not-ready taint
    the API server's TaintNodesByCondition admission gives every new Node (the node
    lifecycle controller of kube-controller-manager, where one runs, lifts it)."""
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
    body["metadata"]["labels"] = {NODE_LABEL: name}  # type: ignore[index]
    node: dict[str, Any] = plane.request("POST", "/api/v1/nodes", body)
    room = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    node["status"] = {
        "capacity": room,
        "allocatable": room,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
            }
        ],
    }
    node = plane.request("PUT", f"/api/v1/nodes/{name}/status", node)
    node["spec"].pop("taints", None)
    updated: dict[str, Any] = plane.request("PUT", f"/api/v1/nodes/{name}", node)
    return updated


def node_ready(plane: ApiAccess, name: str) -> bool:
    """Ready, and no taint (the node lifecycle controller's not-ready one is lifted)."""
    node = plane.request("GET", f"/api/v1/nodes/{name}")
    ready = any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in node.get("status", {}).get("conditions") or []
    )
    return ready and not node.get("spec", {}).get("taints")


# --- what a user writes ---------------------------------------------------------------------


def power_cap(watts: object, **fields: object) -> dict[str, Any]:
    """capwatch's PowerCap parameters (``fields`` override or add any)."""
    return {"apiVersion": POWER_CAP_VERSION, "kind": "PowerCap", "watts": watts, **fields}


def cap_config(parameters: Mapping[str, Any], requests: Sequence[str] = ()) -> dict[str, Any]:
    """One entry of a claim's ``spec.devices.config``: capwatch's opaque config."""
    config: dict[str, Any] = {"opaque": {"driver": CAPWATCH_DRIVER, "parameters": dict(parameters)}}
    if requests:
        config["requests"] = list(requests)
    return config


def claim_spec(requests: Sequence[str], config: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A claim's spec: one GPU of the class per request, and ``config``."""
    return {
        "devices": {
            "requests": [{"name": r, "exactly": {"deviceClassName": GPU_CLASS}} for r in requests],
            "config": [dict(c) for c in config],
        }
    }


def create_claim(plane: ApiAccess, namespace: str, name: str, spec: Mapping[str, Any]) -> None:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": dict(spec),
    }
    plane.request("POST", f"{RESOURCE}/namespaces/{namespace}/resourceclaims", body)


def create_claim_template(
    plane: ApiAccess, namespace: str, name: str, spec: Mapping[str, Any]
) -> None:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": dict(spec)},
    }
    plane.request("POST", f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates", body)


@dataclass(frozen=True)
class PodClaim:
    """One entry of a pod's ``spec.resourceClaims``: a claim by name, or a template."""

    name: str
    claim: str = ""
    template: str = ""

    def entry(self) -> dict[str, str]:
        if self.template:
            return {"name": self.name, "resourceClaimTemplateName": self.template}
        return {"name": self.name, "resourceClaimName": self.claim}


def create_claiming_pod(
    plane: ApiAccess, namespace: str, name: str, node: str, claims: Sequence[PodClaim]
) -> dict[str, Any]:
    """A pod using ``claims`` (its container names each), for the scheduler to place on
    ``node`` (by the node's test label): no nodeName, no process anywhere."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {NODE_LABEL: node},
            "resourceClaims": [c.entry() for c in claims],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/trainer:test",
                    "resources": {"claims": [{"name": c.name} for c in claims]},
                }
            ],
        },
    }
    made: dict[str, Any] = plane.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
    return made


# --- what the API server holds --------------------------------------------------------------


def claim_path(namespace: str, name: str) -> str:
    return f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}"


def get_claim(plane: ApiAccess, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = plane.request("GET", claim_path(namespace, name))
    except ApiError as err:
        if err.status == 404:
            return None
        raise
    return found


def get_pod(plane: ApiAccess, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = plane.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    except ApiError as err:
        if err.status == 404:
            return None
        raise
    return found


def pod_claim_names(pod: Mapping[str, Any]) -> dict[str, str]:
    """The pod's claims, entry name -> ResourceClaim name (a template's from the pod's
    ``status.resourceClaimStatuses``, where kube-controller-manager writes it)."""
    names = {
        c["name"]: c["resourceClaimName"]
        for c in pod["spec"].get("resourceClaims") or []
        if c.get("resourceClaimName")
    }
    for status in pod.get("status", {}).get("resourceClaimStatuses") or []:
        if status.get("resourceClaimName"):
            names[status["name"]] = status["resourceClaimName"]
    return names


def reserved_for(claim: Mapping[str, Any]) -> list[str]:
    """The UIDs of the pods a claim is reserved for."""
    return [r["uid"] for r in claim.get("status", {}).get("reservedFor") or []]


def allocated_devices(claim: Mapping[str, Any]) -> dict[str, tuple[str, str, str]]:
    """request -> (driver, pool, device) of each device the claim's allocation holds."""
    results = claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results")
    return {r["request"]: (r["driver"], r["pool"], r["device"]) for r in results or []}


def allocated_config(claim: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``status.allocation.devices.config``: the configuration the allocation carries."""
    devices = claim.get("status", {}).get("allocation", {}).get("devices", {})
    found: list[dict[str, Any]] = devices.get("config") or []
    return found


# --- what the agent streams -----------------------------------------------------------------


@dataclass(frozen=True)
class Cycle:
    """One completed cycle as the capwatch.v1 Watch sent it: its GPUs by UUID."""

    sequence: int
    enforced: bool
    failures: tuple[str, ...]
    devices: Mapping[str, pb.DeviceStatus]


@dataclass
class AgentStream:
    """An agent's capwatch.v1 Watch, followed on a thread from its first snapshot on."""

    address: str
    node: str
    cycles: list[Cycle] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _error: BaseException | None = None
    _call: Any = None
    _thread: threading.Thread | None = None

    def __enter__(self) -> AgentStream:
        self._channel = grpc.insecure_channel(self.address)
        stub = pb_grpc.NodeHealthServiceStub(self._channel)
        self._call = stub.Watch(pb.WatchRequest(node_name=self.node))
        self._thread = threading.Thread(target=self._run, name=f"stream-{self.node}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._call.cancel()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._channel.close()

    def _run(self) -> None:
        try:
            for response in self._call:
                if response.HasField("cycle"):
                    report = response.cycle
                    cycle = Cycle(
                        sequence=report.sequence,
                        enforced=report.enforced,
                        failures=tuple(f"{f.kind}: {f.message}" for f in report.failures),
                        devices={d.uuid: d for d in report.devices},
                    )
                    with self._lock:
                        self.cycles.append(cycle)
        except grpc.RpcError as err:
            if err.code() is not grpc.StatusCode.CANCELLED:
                with self._lock:
                    self._error = err

    def history(self) -> list[Cycle]:
        with self._lock:
            if self._error is not None:
                raise AssertionError(f"the agent's stream failed: {self._error!r}")
            return list(self.cycles)

    def latest(self, uuid: str) -> pb.DeviceStatus | None:
        """The GPU's status in the latest cycle that reached it."""
        for cycle in reversed(self.history()):
            if uuid in cycle.devices:
                return cycle.devices[uuid]
        return None

    def wait_idle(self, uuids: Sequence[str]) -> None:
        """Until an enforced cycle has found every one of ``uuids`` idle (the agent's first
        cycles may abort while its informers list)."""

        def idle() -> bool:
            return any(
                cycle.enforced
                and all(
                    u in cycle.devices and cycle.devices[u].outcome == pb.OUTCOME_IDLE
                    for u in uuids
                )
                for cycle in self.history()
            )

        wait_until(idle, timeout=30, what=f"an enforced cycle finding {list(uuids)} idle")

    def of(self, uuid: str) -> list[tuple[int, pb.DeviceStatus]]:
        """The GPU's status in every cycle, with the cycle's sequence."""
        return [(c.sequence, c.devices[uuid]) for c in self.history() if uuid in c.devices]


def dra_devices(address: str, node: str) -> dict[tuple[str, str], dra_pb.DeviceHealth]:
    """The agent's DRA resource-health mirror (v1, the kubelet's): its first message, each
    device by (pool, device name)."""
    with grpc.insecure_channel(address) as channel:
        stub = dra_grpc.DRAResourceHealthStub(channel)
        call = stub.NodeWatchResources(
            dra_pb.NodeWatchResourcesRequest(), metadata=((NODE_METADATA_KEY, node),), timeout=10
        )
        try:
            first = next(iter(call))
        finally:
            call.cancel()
    return {(d.device.pool_name, d.device.device_name): d for d in first.devices}
