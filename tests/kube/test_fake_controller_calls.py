"""The controller's own Kubernetes calls (controller/kube.py) against the fake API server:
the fake answers them as the controller expects a real server to, and records them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from controller.conditions import ConditionStatus, NodeCondition
from controller.errors import Conflict, NotFound
from controller.kube import KubeApi
from controller.leasing import LeaseRecord, micro_time
from controller.objects import node_condition
from controller.writes.recorder import EventType, NodeEvent
from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.kube.conftest import ClientFactory

pytestmark = pytest.mark.asyncio
WALL = 1_740_823_200.0  # 2025-03-01T10:00:00Z
GPU = {"nvidia.com/gpu.present": "true"}


@pytest.fixture
def api(make_client: ClientFactory) -> Iterator[KubeApi]:
    kube = KubeApi(make_client("capwatch-controller/r0"), namespace="capwatch", identity="r0")
    yield kube
    kube.close()


def _condition(status: ConditionStatus, reason: str, heartbeat: float) -> NodeCondition:
    return NodeCondition(
        status=status,
        reason=reason,
        message="GPU 3: cap write failed",
        last_transition_wall=WALL,
        last_heartbeat_wall=heartbeat,
    )


async def test_condition_patch_and_removal_leave_other_conditions(
    kube_apiserver: FakeKubeApiServer, api: KubeApi
) -> None:
    """patch_condition adds GPUPowerCapEnforced beside the kubelet's Ready and later
    patches replace it in place; remove_condition deletes only it; list_nodes by the
    GPU label reads it back through node_condition; every write is logged as r0's."""
    kube_apiserver.add_node("n1", labels=GPU)
    kube_apiserver.add_node("cpu")
    await api.patch_condition(
        "n1", _condition(ConditionStatus.FALSE, "CapWriteFailed", WALL), deadline_s=5
    )
    later = _condition(ConditionStatus.FALSE, "CapWriteFailed", WALL + 300)
    await api.patch_condition("n1", later, deadline_s=5)
    (node,) = await api.list_nodes(label_selector="nvidia.com/gpu.present=true", deadline_s=5)
    assert [c["type"] for c in node["status"]["conditions"]] == ["Ready", "GPUPowerCapEnforced"]
    assert node_condition(node) == later

    await api.remove_condition("n1", deadline_s=5)
    current = kube_apiserver.node("n1")
    assert current is not None
    assert [c["type"] for c in current["status"]["conditions"]] == ["Ready"]
    writes = kube_apiserver.node_status_writes("n1")
    assert [w.user_agent for w in writes] == ["capwatch-controller/r0"] * 3


async def test_node_event_is_created_in_default(
    kube_apiserver: FakeKubeApiServer, api: KubeApi
) -> None:
    """create_event posts a Node Event in ``default`` that the fake accepts under the
    controller's name for it, recorded with the controller's User-Agent."""
    event = NodeEvent(node="n1", type=EventType.WARNING, reason="R", message="m", wall=WALL)
    await api.create_event(event, deadline_s=5)
    (write,) = kube_apiserver.event_writes()
    assert write.namespace == "default"
    assert write.name.startswith("n1.")
    assert write.user_agent == "capwatch-controller/r0"
    assert write.event["involvedObject"]["kind"] == "Node"


async def test_lease_calls_meet_real_optimistic_concurrency(
    kube_apiserver: FakeKubeApiServer, api: KubeApi
) -> None:
    """get_lease of none is None; create_lease stores the MicroTime record; a second
    create is Conflict; update_lease at the read resourceVersion succeeds, at a stale one
    is Conflict; an update of a Lease that is gone is NotFound."""
    assert await api.get_lease("capwatch-controller-0", deadline_s=5) is None
    now = micro_time(WALL)
    mine = LeaseRecord(holder="r0", lease_duration_s=15, acquire_time=now, renew_time=now)
    created = await api.create_lease("capwatch-controller-0", mine, deadline_s=5)
    assert created.holder == "r0"
    assert created.resource_version
    with pytest.raises(Conflict):
        await api.create_lease("capwatch-controller-0", mine, deadline_s=5)

    renewed = await api.update_lease(
        "capwatch-controller-0",
        LeaseRecord(
            holder="r0",
            lease_duration_s=15,
            acquire_time=now,
            renew_time=micro_time(WALL + 2),
            resource_version=created.resource_version,
        ),
        deadline_s=5,
    )
    assert renewed.renew_time == micro_time(WALL + 2)
    with pytest.raises(Conflict):
        await api.update_lease("capwatch-controller-0", created, deadline_s=5)
    with pytest.raises(NotFound):
        await api.update_lease("capwatch-controller-9", created, deadline_s=5)
    assert [w.holder for w in kube_apiserver.lease_writes("capwatch")] == ["r0", "r0"]
