"""The sim DRA driver's ResourceSlice on a real kube-apiserver: the API's own validation
accepts what agent.dra.simdriver builds, and agent.kube.slice_publisher's apply creates
it, changes it in place, brings it back once deleted, and takes back a field another
manager changed (the slice is the driver's alone)."""

from __future__ import annotations

import pytest

from capwatch.agent.dra.simdriver import SimDevice, resource_slice, slice_name
from capwatch.agent.kube.slice_publisher import (
    FIELD_MANAGER,
    SLICES,
    SlicePublisher,
    SlicePublishError,
)
from tests.kube.rawapi import call
from tests.kube.realserver import RealApiServer

pytestmark = pytest.mark.timeout(120)

NODE = "sim-slice-node"
GPUS = [SimDevice(name=f"gpu-{i}", index=i, uuid=f"GPU-{i}") for i in range(2)]


def test_the_slice_is_applied_changed_restored_and_taken_back(real: RealApiServer) -> None:
    """Create by apply (owned by the Node, manager capwatch-sim-driver); a third GPU
    applied later changes it in place; deleted, the next apply makes it again; a
    generation someone else wrote is put back by the next apply."""
    admin = real.client("admin")
    node = call(admin, "POST", "/api/v1/nodes", body={"metadata": {"name": NODE}}).body
    publisher = SlicePublisher(real.client("capwatch-sim-driver/test"))
    path = f"{SLICES}/{slice_name(NODE)}"
    try:
        uid = publisher.node_uid(NODE)
        assert uid == node["metadata"]["uid"]
        publisher.apply(resource_slice(node=NODE, node_uid=uid, pool=NODE, devices=GPUS))
        created = call(admin, "GET", path).body
        assert created["spec"]["driver"] == "sim.capwatch.io"
        assert [d["name"] for d in created["spec"]["devices"]] == ["gpu-0", "gpu-1"]
        assert created["spec"]["devices"][1]["attributes"] == {
            "index": {"int": 1},
            "uuid": {"string": "GPU-1"},
        }
        assert created["metadata"]["ownerReferences"][0]["uid"] == uid
        managers = {(m["manager"], m["operation"]) for m in created["metadata"]["managedFields"]}
        assert managers == {(FIELD_MANAGER, "Apply")}

        three = [*GPUS, SimDevice(name="gpu-2", index=2, uuid="GPU-2")]
        publisher.apply(resource_slice(node=NODE, node_uid=uid, pool=NODE, devices=three))
        changed = call(admin, "GET", path).body
        assert changed["metadata"]["uid"] == created["metadata"]["uid"]
        assert len(changed["spec"]["devices"]) == 3

        assert call(admin, "DELETE", path).status == 200
        publisher.apply(resource_slice(node=NODE, node_uid=uid, pool=NODE, devices=three))
        assert call(admin, "GET", path).status == 200

        edited = call(admin, "GET", path).body
        edited["spec"]["pool"]["generation"] = 7
        answer = call(admin, "PUT", path, query={"fieldManager": "kubectl-edit"}, body=edited)
        assert answer.status == 200, answer.body
        publisher.apply(resource_slice(node=NODE, node_uid=uid, pool=NODE, devices=three))
        assert call(admin, "GET", path).body["spec"]["pool"]["generation"] == 1
    finally:
        call(admin, "DELETE", path)


def test_a_slice_the_api_refuses_is_one_line(real: RealApiServer) -> None:
    """An invalid device name (not a DNS label) is the API server's 422, said in one
    line naming the slice, never a half-made slice."""
    publisher = SlicePublisher(real.client("capwatch-sim-driver/test"))
    bad = [SimDevice(name="GPU_0", index=0, uuid="GPU-0")]
    with pytest.raises(SlicePublishError) as refused:
        publisher.apply(resource_slice(node=NODE, node_uid=None, pool=NODE, devices=bad))
    assert f"apply resourceslices/{slice_name(NODE)}: HTTP 422" in str(refused.value)
    assert "\n" not in str(refused.value)
    assert call(real.client("admin"), "GET", f"{SLICES}/{slice_name(NODE)}").status == 404
