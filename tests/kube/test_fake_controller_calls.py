"""The controller's own Kubernetes calls (controller/kube.py) on the fake and on a real
kube-apiserver (``apiserver``): each server answers them as the controller expects.
That the fake records them as the controller's (its write logs) is the fake's alone
(tests taking ``kube_apiserver``)."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlencode

import pytest

from capwatch.controller.conditions import ConditionStatus, NodeCondition
from capwatch.controller.errors import ApiError, Conflict
from capwatch.controller.kube import KubeApi
from capwatch.controller.leasing import LeaseRecord, micro_time
from capwatch.controller.objects import node_condition, resource_version
from capwatch.controller.writes.recorder import EventType, NodeEvent
from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.kube.conftest import ClientFactory
from tests.kube.rawapi import call
from tests.kube.servers import ApiServer

pytestmark = pytest.mark.asyncio
WALL = 1_740_823_200.0  # 2025-03-01T10:00:00Z
GPU = {"nvidia.com/gpu.present": "true"}


@pytest.fixture
def api(apiserver: ApiServer) -> Iterator[KubeApi]:
    kube = KubeApi(apiserver.client("capwatch-controller/r0"), namespace="capwatch", identity="r0")
    yield kube
    kube.close()


@pytest.fixture
def fake_api(make_client: ClientFactory) -> Iterator[KubeApi]:
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
    apiserver: ApiServer, api: KubeApi
) -> None:
    """apply_condition adds GPUPowerCapEnforced beside the kubelet's Ready (after it, as
    the real server orders an element an apply adds) and later applies replace it in place, each
    answering the Node's new resourceVersion (higher each time); remove_condition deletes
    only it; list_nodes by the GPU label reads it back through node_condition."""
    apiserver.add_node("n1", labels=GPU)
    apiserver.add_node("cpu")
    first = await api.apply_condition(
        "n1", _condition(ConditionStatus.FALSE, "CapWriteFailed", WALL), deadline_s=10
    )
    later = _condition(ConditionStatus.FALSE, "CapWriteFailed", WALL + 300)
    second = await api.apply_condition("n1", later, deadline_s=10)
    assert first is not None
    assert second is not None
    assert second > first
    (node,) = await api.list_nodes(label_selector="nvidia.com/gpu.present=true", deadline_s=10)
    assert [c["type"] for c in node["status"]["conditions"]] == ["Ready", "GPUPowerCapEnforced"]
    assert node_condition(node) == later
    assert resource_version(node) == second

    await api.remove_condition("n1", deadline_s=10)
    current = apiserver.node("n1")
    assert current is not None
    assert [c["type"] for c in current["status"]["conditions"]] == ["Ready"]


async def test_condition_writes_are_logged_as_the_controllers(
    kube_apiserver: FakeKubeApiServer, fake_api: KubeApi
) -> None:
    """The fake's write log: each of the controller's status writes under its
    User-Agent, a removal of an absent condition included."""
    kube_apiserver.add_node("n1", labels=GPU)
    await fake_api.apply_condition(
        "n1", _condition(ConditionStatus.TRUE, "CapsEnforced", WALL), deadline_s=5
    )
    await fake_api.remove_condition("n1", deadline_s=5)
    await fake_api.remove_condition("n1", deadline_s=5)
    writes = kube_apiserver.node_status_writes("n1")
    assert [w.user_agent for w in writes] == ["capwatch-controller/r0"] * 3
    assert writes[0].content_type == "application/apply-patch+yaml"
    assert {r.query.get("fieldManager") for r in kube_apiserver.requests("node_status")} == {
        "capwatch-controller"
    }


async def test_node_event_is_created_in_default(apiserver: ApiServer, api: KubeApi) -> None:
    """create_event posts a Node Event in ``default`` under the controller's name for it
    (``<node>.<hex>``), which the server takes as is, also for a node name of 253
    characters (an Event name far past a DNS subdomain's)."""
    long_node = "n" * 253
    for node in ("n1", long_node):
        event = NodeEvent(node=node, type=EventType.WARNING, reason="R", message="m", wall=WALL)
        await api.create_event(event, deadline_s=10)
    events = {e["involvedObject"]["name"]: e for e in apiserver.events("default")}
    assert events["n1"]["metadata"]["name"].startswith("n1.")
    assert events["n1"]["involvedObject"]["kind"] == "Node"
    assert (events["n1"]["reportingComponent"], events["n1"]["reportingInstance"]) == (
        "capwatch.io/capwatch-controller",  # the default release's
        "r0",
    )
    assert events["n1"]["firstTimestamp"] == "2025-03-01T10:00:00Z"
    assert events[long_node]["metadata"]["name"].startswith(long_node + ".")
    query = urlencode({"fieldSelector": f"involvedObject.name={long_node}"})
    found = call(apiserver.client(), "GET", f"/api/v1/events?{query}")
    assert len(found.body["items"]) == 1


async def test_node_event_is_logged_with_the_controllers_user_agent(
    kube_apiserver: FakeKubeApiServer, fake_api: KubeApi
) -> None:
    """The fake's write log has the Event under the controller's User-Agent."""
    event = NodeEvent(node="n1", type=EventType.WARNING, reason="R", message="m", wall=WALL)
    await fake_api.create_event(event, deadline_s=5)
    (write,) = kube_apiserver.event_writes()
    assert (write.namespace, write.user_agent) == ("default", "capwatch-controller/r0")
    assert write.name.startswith("n1.")


async def test_lease_calls_meet_real_optimistic_concurrency(
    apiserver: ApiServer, api: KubeApi
) -> None:
    """get_lease of none is None; create_lease stores the MicroTime record; a second
    create is Conflict; update_lease at the read resourceVersion succeeds, at a stale one
    is Conflict; an update of a Lease that is gone, from the object once read (its uid a
    precondition), is Conflict too; from a record never read it creates the Lease
    (Leases allow create on update: no NotFound ever comes back from a PUT)."""
    assert await api.get_lease("capwatch-controller-0", deadline_s=10) is None
    now = micro_time(WALL)
    mine = LeaseRecord(holder="r0", lease_duration_s=15, acquire_time=now, renew_time=now)
    created = await api.create_lease("capwatch-controller-0", mine, deadline_s=10)
    assert created.holder == "r0"
    assert created.resource_version
    with pytest.raises(Conflict):
        await api.create_lease("capwatch-controller-0", mine, deadline_s=10)

    renewed = await api.update_lease(
        "capwatch-controller-0",
        LeaseRecord(
            holder="r0",
            lease_duration_s=15,
            acquire_time=now,
            renew_time=micro_time(WALL + 2),
            resource_version=created.resource_version,
        ),
        deadline_s=10,
    )
    assert renewed.renew_time == micro_time(WALL + 2)
    with pytest.raises(Conflict):
        await api.update_lease("capwatch-controller-0", created, deadline_s=10)
    with pytest.raises(Conflict):
        await api.update_lease("capwatch-controller-9", renewed, deadline_s=10)
    unread = LeaseRecord(
        holder="r0",
        lease_duration_s=15,
        acquire_time=now,
        renew_time=now,
        resource_version=created.resource_version,
    )
    recreated = await api.update_lease("capwatch-controller-9", unread, deadline_s=10)
    assert (recreated.holder, recreated.renew_time) == ("r0", now)
    assert recreated.resource_version != created.resource_version
    fetched = await api.get_lease("capwatch-controller-9", deadline_s=10)
    assert fetched is not None
    assert fetched.resource_version == recreated.resource_version


async def test_lease_writes_are_logged_as_the_controllers(
    kube_apiserver: FakeKubeApiServer, fake_api: KubeApi
) -> None:
    """The fake's write log: the controller's create and update under its holder."""
    now = micro_time(WALL)
    mine = LeaseRecord(holder="r0", lease_duration_s=15, acquire_time=now, renew_time=now)
    created = await fake_api.create_lease("capwatch-controller-0", mine, deadline_s=5)
    renewal = LeaseRecord(
        holder="r0",
        lease_duration_s=15,
        acquire_time=now,
        renew_time=micro_time(WALL + 2),
        resource_version=created.resource_version,
    )
    await fake_api.update_lease("capwatch-controller-0", renewal, deadline_s=5)
    writes = kube_apiserver.lease_writes("capwatch")
    assert [(w.method, w.holder, w.user_agent) for w in writes] == [
        ("POST", "r0", "capwatch-controller/r0"),
        ("PUT", "r0", "capwatch-controller/r0"),
    ]


async def test_a_throttled_kind_answers_429_past_its_rate(
    kube_apiserver: FakeKubeApiServer, fake_api: KubeApi
) -> None:
    """The fake's throttle: at most N node status writes in a second get through, the rest
    are answered 429 with the throttle's Retry-After (the condition writer's 429 path is
    driven by it in bench/scenarios/throttling.py); without the throttle every write lands."""
    kube_apiserver.add_node("n1", labels=GPU)
    kube_apiserver.throttle("node_status", 3, retry_after=2)
    condition = _condition(ConditionStatus.TRUE, "CapsEnforced", WALL)
    refused: list[ApiError] = []
    for _ in range(8):
        try:
            await fake_api.apply_condition("n1", condition, deadline_s=5)
        except ApiError as err:
            refused.append(err)
    # A second's boundary may fall inside the loop: 3 to 6 get through, never more.
    assert 2 <= len(refused) <= 5
    assert {(err.status, err.retry_after) for err in refused} == {(429, 2.0)}
    kube_apiserver.throttle("node_status", 0)
    await fake_api.apply_condition("n1", condition, deadline_s=5)
