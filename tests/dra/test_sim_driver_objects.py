"""The sim DRA driver's pure half (agent.dra.simdriver): the ResourceSlice it publishes
and which devices preparing a claim answers with."""

from __future__ import annotations

from typing import Any

import pytest

from capwatch.agent.dra.simdriver import (
    DRIVER,
    PreparedDevice,
    PrepareError,
    SimDevice,
    prepared_devices,
    resource_slice,
    slice_name,
)

DEVICES = (
    SimDevice(name="gpu-1", index=1, uuid="GPU-1"),
    SimDevice(name="gpu-0", index=0, uuid="GPU-0"),
    SimDevice(name="gpu-2", index=2, uuid=None),
)
UID = "0b5e1c1e-0000-4000-8000-000000000001"


def claim(*results: dict[str, Any], uid: str = UID, allocated: bool = True) -> dict[str, Any]:
    status: dict[str, Any] = (
        {"allocation": {"devices": {"results": list(results)}}} if allocated else {}
    )
    return {"metadata": {"namespace": "ml", "name": "one-gpu", "uid": uid}, "status": status}


def result(device: str, *, request: str = "gpu", pool: str = "node-a", **extra: Any) -> dict:
    return {"request": request, "driver": DRIVER, "pool": pool, "device": device, **extra}


def prepare(found: dict[str, Any]) -> tuple[PreparedDevice, ...]:
    return prepared_devices(found, uid=UID, pool="node-a", devices=("gpu-0", "gpu-1", "gpu-2"))


def test_the_slice_lists_every_gpu_in_index_order_with_uuid_and_index_attributes() -> None:
    """One pool named as the mirror names it, one slice of generation 1 on the node,
    owned by the Node; a GPU whose UUID was not read has no uuid attribute."""
    body = resource_slice(node="node-a", node_uid="n-uid", pool="node-a", devices=DEVICES)
    assert body["metadata"]["name"] == slice_name("node-a") == "node-a-sim.capwatch.io"
    assert body["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "n-uid", "controller": True}
    ]
    spec = body["spec"]
    assert (spec["driver"], spec["nodeName"]) == (DRIVER, "node-a")
    assert spec["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 1}
    assert spec["devices"] == [
        {"name": "gpu-0", "attributes": {"index": {"int": 0}, "uuid": {"string": "GPU-0"}}},
        {"name": "gpu-1", "attributes": {"index": {"int": 1}, "uuid": {"string": "GPU-1"}}},
        {"name": "gpu-2", "attributes": {"index": {"int": 2}}},
    ]


def test_a_node_that_could_not_be_read_leaves_the_slice_unowned() -> None:
    """No owner reference rather than a wrong one."""
    body = resource_slice(node="node-a", node_uid=None, pool="p", devices=DEVICES)
    assert "ownerReferences" not in body["metadata"]


def test_prepare_answers_this_drivers_devices_and_skips_other_drivers() -> None:
    """Each of this driver's devices once, with every request naming it; another
    driver's device in the same claim is that driver's to prepare."""
    found = claim(
        result("gpu-1", request="a"),
        result("gpu-1", request="b"),
        {"request": "nic", "driver": "nic.example.com", "pool": "x", "device": "eth0"},
        result("gpu-0", request="a"),
    )
    assert prepare(found) == (
        PreparedDevice(requests=("a", "b"), pool="node-a", device="gpu-1"),
        PreparedDevice(requests=("a",), pool="node-a", device="gpu-0"),
    )


def test_a_shared_device_keeps_its_share_id() -> None:
    """A device allocated with a share ID (consumable capacity) is answered with it."""
    found = claim(result("gpu-2", shareID="s-1"))
    assert prepare(found) == (
        PreparedDevice(requests=("gpu",), pool="node-a", device="gpu-2", share_id="s-1"),
    )


@pytest.mark.parametrize(
    ("found", "why"),
    [
        (claim(result("gpu-0"), uid="another"), "has UID 'another'"),
        (claim(allocated=False), "is not allocated"),
        (claim(result("gpu-0", pool="node-b")), "not in this node's pool node-a"),
        (claim(result("gpu-7")), "gpu-7 is not one of this node's sim GPUs"),
    ],
)
def test_a_claim_that_cannot_be_prepared_says_why_in_one_line(found: dict, why: str) -> None:
    """A claim made again under another UID, one not allocated, one allocated in
    another pool, and one naming a device this node lacks are refused, naming the claim."""
    with pytest.raises(PrepareError) as caught:
        prepare(found)
    assert why in str(caught.value)
    assert "ResourceClaim ml/one-gpu" in str(caught.value)
    assert "\n" not in str(caught.value)
