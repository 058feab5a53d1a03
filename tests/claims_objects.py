"""ResourceClaims and ResourceSlices as the API server serves them (resource.k8s.io/v1),
built for the claims tests: a slice like the NVIDIA DRA driver's, allocated claims."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agent.claims import API_VERSION, DRIVER, KIND
from agent.pods import PodRef

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
