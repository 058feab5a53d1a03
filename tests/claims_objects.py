"""ResourceClaims and ResourceSlices as the API server serves them (resource.k8s.io/v1),
built for the claims tests: a slice like the NVIDIA DRA driver's, allocated claims."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from capwatch.agent.dra.claims import (
    API_VERSION,
    DRIVER,
    KIND,
    ClaimsSnapshot,
    Pin,
    ReadClaim,
    claims_snapshot,
)
from capwatch.agent.dra.slices import node_devices
from capwatch.agent.pods import PodRef

NODE = "gpu-node-1"
GPU = "gpu.nvidia.com"
UUIDS = tuple(f"GPU-c1a1{i:04d}-0000-4000-8000-000000000000" for i in range(4))
POD = PodRef(namespace="ml", name="train-0", uid="pod-uid-0")


def power_cap(watts: Any, **changes: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "watts": watts, **changes}


def slice_of(
    node: str = NODE,
    *,
    attribute: str = "uuid",
    driver: str = GPU,
    uuids: Sequence[str] = UUIDS,
) -> dict[str, Any]:
    """A ResourceSlice as the NVIDIA DRA driver publishes one: a pool per node."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}-abcde", "uid": f"slice-{node}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"gpu-{i}",
                    "attributes": {
                        attribute: {"string": uuid},
                        "index": {"int": i},
                        "productName": {"string": "NVIDIA H100 80GB HBM3"},
                    },
                }
                for i, uuid in enumerate(uuids)
            ],
        },
    }


def claim(
    name: str,
    devices: dict[str, str],
    *,
    config: list[dict[str, Any]] | None = None,
    pool: str = NODE,
    reserved: tuple[PodRef, ...] = (POD,),
) -> dict[str, Any]:
    """An allocated ResourceClaim: ``devices`` maps request name -> device name."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": "ml", "name": name, "uid": f"claim-{name}"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": request, "driver": GPU, "pool": pool, "device": device}
                        for request, device in devices.items()
                    ],
                    "config": config or [],
                }
            },
            "reservedFor": [{"resource": "pods", "name": p.name, "uid": p.uid} for p in reserved],
        },
    }


def capwatch(parameters: Any, *requests: str) -> dict[str, Any]:
    """A capwatch.io opaque config as the allocation carries it (copied from the claim)."""
    return {
        "source": "FromClaim",
        "requests": list(requests),
        "opaque": {"driver": DRIVER, "parameters": parameters},
    }


def join(
    claims: Sequence[dict[str, Any]],
    slices: Sequence[dict[str, Any]],
    *,
    node: str = NODE,
    pins: Mapping[Pin, str] | None = None,
    unread: Mapping[str, str] | None = None,
    attribute: str = "uuid",
) -> ClaimsSnapshot:
    """claims_snapshot as the views call it: each claim read (in namespace ml) and used by
    the pods it is reserved for; ``unread`` names claims that could not be read, and why."""
    reads = [
        ReadClaim(key=(c["metadata"]["namespace"], c["metadata"]["name"]), obj=c) for c in claims
    ]
    reads += [
        ReadClaim(key=("ml", name), obj=None, problem=why) for name, why in (unread or {}).items()
    ]
    using = {read.key: _users(read.obj) for read in reads}
    devices = node_devices(slices, node=node, uuid_attribute=attribute)
    return claims_snapshot(reads, using, devices, pins=pins)


def _users(obj: Mapping[str, Any] | None) -> tuple[PodRef, ...]:
    if obj is None:
        return (POD,)
    namespace = obj["metadata"]["namespace"]
    reserved = obj.get("status", {}).get("reservedFor", [])
    return tuple(PodRef(namespace=namespace, name=r["name"], uid=r["uid"]) for r in reserved)
