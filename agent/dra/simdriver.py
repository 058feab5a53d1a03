"""capwatch's own DRA driver for the sim backend (``sim.capwatch.io``): what it publishes
and what preparing a claim means.

With the sim backend there is no GPU driver to prepare devices, so the kubelet would
never ask anyone for their health. capwatch can then be that driver: it publishes one
ResourceSlice with the node's simulated GPUs, named as its DRA health mirror names them
(pool and device), each with the ``uuid`` and ``index`` attributes NVIDIA's driver
gives its GPUs (a claim selects one with CEL: ``device.attributes["sim.capwatch.io"].index
== 2``). Preparing a claim changes nothing on the node: it answers with the claim's
devices of this driver and this pool, and no CDI device (a simulated GPU has no device
node to inject). The kubelet then keys the health it reads from capwatch's mirror by
those devices.

Everything here is pure: JSON mappings as the API server serves them in, values out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from capwatch.kit.errors import CapwatchError

DRIVER = "sim.capwatch.io"
RESOURCE_API = "resource.k8s.io/v1"
SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"


class PrepareError(CapwatchError):
    """A claim this driver cannot prepare; the message is one line for the kubelet."""


@dataclass(frozen=True, kw_only=True)
class SimDevice:
    """One simulated GPU as the slice lists it."""

    name: str  # the mirror's device name (gpu-0)
    index: int
    uuid: str | None  # None: unread at start; the attribute is left out


@dataclass(frozen=True, kw_only=True)
class PreparedDevice:
    """One device of a claim, as NodePrepareResources answers it."""

    requests: tuple[str, ...]
    pool: str
    device: str
    share_id: str | None = None


def slice_name(node: str) -> str:
    """One slice per node: a DNS subdomain as long as the node's name leaves room."""
    return f"{node}-{DRIVER}"


def resource_slice(
    *, node: str, node_uid: str | None, pool: str, devices: Sequence[SimDevice]
) -> dict[str, Any]:
    """The node's ResourceSlice: one pool, one slice, generation 1 (the slice is
    rewritten in place, never split, so the scheduler never sees two generations).

    Owned by the Node (``node_uid``), so it goes when the node does; the kubelet
    deletes a driver's slices itself when the driver stays unregistered."""
    metadata: dict[str, Any] = {"name": slice_name(node)}
    if node_uid:
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
        ]
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceSlice",
        "metadata": metadata,
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
            "devices": [_device(d) for d in sorted(devices, key=lambda d: d.index)],
        },
    }


def _device(device: SimDevice) -> dict[str, Any]:
    attributes: dict[str, Any] = {"index": {"int": device.index}}
    if device.uuid:
        attributes["uuid"] = {"string": device.uuid}
    return {"name": device.name, "attributes": attributes}


def prepared_devices(
    claim: Mapping[str, Any], *, uid: str, pool: str, devices: Iterable[str]
) -> tuple[PreparedDevice, ...]:
    """The devices of ``claim`` this driver prepares on this node: its allocation's
    results of driver sim.capwatch.io, each in ``pool`` and among ``devices``.

    Raises :class:`PrepareError` when the claim is not the one the kubelet asked for
    (another UID: deleted and made again), is not allocated, or names a device of this
    driver that this node does not have."""
    meta = _mapping(claim.get("metadata"))
    where = f"ResourceClaim {meta.get('namespace', '')}/{meta.get('name', '')}"
    if meta.get("uid") != uid:
        raise PrepareError(f"{where} has UID {meta.get('uid')!r}, the kubelet asked for {uid!r}")
    allocation = _mapping(_mapping(claim.get("status")).get("allocation"))
    results = _mapping(allocation.get("devices")).get("results")
    if not allocation or not isinstance(results, list):
        raise PrepareError(f"{where} is not allocated")
    known = set(devices)
    found: dict[tuple[str, str | None], list[str]] = {}
    for result in results:
        entry = _mapping(result)
        if entry.get("driver") != DRIVER:
            continue  # another driver's device: that driver prepares it
        name, where_pool = str(entry.get("device", "")), str(entry.get("pool", ""))
        if where_pool != pool:
            raise PrepareError(
                f"{where}: device {where_pool}/{name} is not in this node's pool {pool}"
            )
        if name not in known:
            raise PrepareError(f"{where}: device {name} is not one of this node's sim GPUs")
        share = entry.get("shareID")
        requests = found.setdefault((name, str(share) if share else None), [])
        request = str(entry.get("request", ""))
        if request and request not in requests:
            requests.append(request)
    return tuple(
        PreparedDevice(requests=tuple(requests), pool=pool, device=name, share_id=share)
        for (name, share), requests in found.items()
    )


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
