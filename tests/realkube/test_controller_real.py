"""``capwatch controller`` end to end on the real API server, as the chart runs it: its
rendered args, as its own ServiceAccount under exactly the chart's RBAC, against
``capwatch pool`` agents found through real agent pods.

Two replicas of one shard elect a leader on a real Lease, renew it, hand it over on
SIGTERM (released, taken at the standby's next retry) and, after kill -9, take it over
once the record's lease duration has run out. The leader writes GPUPowerCapEnforced by
server-side apply of nodes/<n>/status and posts Events that `kubectl describe node`
finds; ``capwatch controller cleanup`` removes the condition.

Lease timings are scaled down (lease 4 s, renew deadline 3 s, retry 0.5 s, so a standby
tries every 0.5-1.1 s). Takeover bound after the leader stops renewing: one jittered
retry to see the last renewal, the record's duration, one more retry; plus a margin for
a loaded 2-core machine.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chart.support import Helm
from tests.controller.e2e.processes import START_S, Process, wait_until
from tests.realkube.access import ApiError
from tests.realkube.components import (
    LEASE_S,
    RETRY_S,
    Scene,
    open_scene,
    unique,
)
from tests.realkube.controlplane import ControlPlane
from tests.realkube.watching import ObjectWatch, micro_time

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

JITTERED_RETRY_S = RETRY_S * 2.2  # client-go's jitter factor 1.2
RECORDED_LEASE_S = math.ceil(LEASE_S)
TAKEOVER_BOUND_S = JITTERED_RETRY_S + RECORDED_LEASE_S + JITTERED_RETRY_S
MARGIN_S = 3.0
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{}/leases"
FENCING = ("--set", "controller.fencing.admissionPolicy=true")


@pytest.fixture
def scene(
    request: pytest.FixtureRequest,
    realkube: ControlPlane,
    realkube_namespace: str,
    helm: Helm,
    tmp_path: Path,
) -> Iterator[Scene]:
    """A release in the test's namespace, the controller's and the hook's RBAC applied;
    with the parameter "fenced", controller.fencing.admissionPolicy on and its policies
    applied too."""
    fenced = getattr(request, "param", "unfenced") == "fenced"
    values = FENCING if fenced else ()
    with open_scene(
        realkube,
        realkube_namespace,
        helm,
        tmp_path,
        components=("controller", "cleanup"),
        values=values,
    ) as opened:
        if fenced:
            opened.install_fencing()
        yield opened


FENCED = pytest.mark.parametrize("scene", ["unfenced", "fenced"], indirect=True)


def _agents(scene: Scene, count: int) -> list[str]:
    """A pool serving ``count`` GPU nodes, each with its Node and its agent pod."""
    prefix = unique("gpu")
    scene.pool(prefix, count)
    nodes = [f"{prefix}{i}" for i in range(count)]
    for node in nodes:
        scene.gpu_node(node)
        scene.agent_pod(node, scene.loopback.ip(1))
    scene.wait_cycled(nodes)
    return nodes


def _pod_of(identity: str) -> str:
    """The pod a Lease holder identity names (``<pod>_<random>``)."""
    return identity.rsplit("_", 1)[0]


def _pair(scene: Scene, nodes: list[str]) -> tuple[Process, Process, str]:
    """Replicas 0 and 1 started together: (leader, standby, the leader's identity), once
    the leader has written every node True."""
    replicas = {f"{scene.release.name}-controller-{i}": scene.controller(i) for i in (0, 1)}
    holder = wait_until(scene.holder, timeout=START_S, what="a replica to take the Lease")
    leader = replicas.pop(_pod_of(holder))
    (standby,) = replicas.values()
    for node in nodes:
        scene.wait_condition(node, "True", "CapsEnforced", timeout=START_S)
    standby.wait_log(r"controller started", timeout=START_S)
    return leader, standby, holder


@FENCED
def test_two_replicas_elect_renew_and_hand_over_on_sigterm(scene: Scene) -> None:
    """Started together, exactly one replica holds the Lease (its recorded duration the 4 s
    asked for), renews it (renewTime moves, acquireTime and transitions stay) while the
    other never holds it; on SIGTERM the leader exits 0 after writing the Lease released
    (no holder, 1 s), and the standby takes it at its next retry, long before the old
    record could have expired, counting one transition; it then writes what changes, and
    leaves what does not (no new lastTransitionTime, no Event, on the node still True).
    Fenced: the same, with the chart's admission policy admitting each leader's writes
    (its Lease identity is what its pod-bound token says)."""
    nodes = _agents(scene, 2)
    with ObjectWatch(scene.plane, LEASES.format(scene.namespace), scene.lease_name()) as watch:
        leader, standby, holder = _pair(scene, nodes)
        first = scene.lease()
        assert first is not None
        assert first["spec"]["leaseDurationSeconds"] == RECORDED_LEASE_S
        renewed = wait_until(
            lambda: [s for s in watch.specs() if s["renewTime"] != first["spec"]["renewTime"]],
            timeout=10,
            what="a renewal",
        )[-1]
        assert renewed["holderIdentity"] == holder
        assert renewed["acquireTime"] == first["spec"]["acquireTime"]
        assert renewed["leaseTransitions"] == first["spec"]["leaseTransitions"]

        kept, told = scene.condition(nodes[1]), scene.node_events(nodes[1])
        leader.signal(signal.SIGTERM)
        assert leader.wait(timeout=30) == 0, leader.log[-3000:]
        new = wait_until(
            lambda: scene.holder() not in ("", holder) and scene.holder(),
            timeout=10,
            what="the standby to take the Lease",
        )
        specs = watch.specs()
    assert _pod_of(new) != _pod_of(holder)
    assert f"released lease={scene.lease_name()}" in leader.log
    held = [s["holderIdentity"] for s in specs]
    assert set(held) == {holder, "", new}, held
    assert held.index("") < held.index(new), held  # released first, then taken
    last_renewal = max(micro_time(s["renewTime"]) for s in specs if s["holderIdentity"] == holder)
    released = next(s for s in specs if s["holderIdentity"] == "")
    assert released["leaseDurationSeconds"] == 1
    taken = next(s for s in specs if s["holderIdentity"] == new)
    # Handed over: no waiting out the old record's duration.
    assert micro_time(taken["acquireTime"]) < last_renewal + RECORDED_LEASE_S
    assert taken["leaseTransitions"] == first["spec"]["leaseTransitions"] + 1

    pod = _agent_pod_name(scene, nodes[0])
    scene.delete_pod(pod)
    scene.wait_condition(nodes[0], "Unknown", "AgentMissing")
    wait_until(
        lambda: [e for e in scene.node_events(nodes[0]) if e["reason"] == "AgentMissing"],
        what="the new leader's Event",
    )
    (event,) = [e for e in scene.node_events(nodes[0]) if e["reason"] == "AgentMissing"]
    assert event["reportingInstance"] == new
    assert standby.popen.poll() is None
    # The new leader started from what the Nodes carry: nothing unchanged was rewritten
    # as a transition, and no Event says that a node still True is True.
    after = scene.condition(nodes[1])
    assert after is not None
    assert kept is not None
    assert (after["status"], after["lastTransitionTime"]) == ("True", kept["lastTransitionTime"])
    assert scene.node_events(nodes[1]) == told


@FENCED
def test_a_killed_leader_is_replaced_once_its_lease_runs_out(scene: Scene) -> None:
    """kill -9 of the leader: the standby takes the Lease once the record's
    leaseDurationSeconds has passed since the dead leader's last renewal (never sooner),
    within the takeover bound of the kill, one transition more; then it is the one that
    writes (an agent pod deleted reads AgentMissing, posted under its identity). Fenced:
    the new leader's writes are admitted, and a write with the dead leader's token is
    refused by the policy."""
    nodes = _agents(scene, 2)
    with ObjectWatch(scene.plane, LEASES.format(scene.namespace), scene.lease_name()) as watch:
        leader, _standby, holder = _pair(scene, nodes)
        before = scene.lease()
        assert before is not None
        killed = time.time()
        leader.signal(signal.SIGKILL)
        leader.wait(timeout=10)
        new = wait_until(
            lambda: scene.holder() not in ("", holder) and scene.holder(),
            timeout=TAKEOVER_BOUND_S + MARGIN_S + 10,
            what="the standby to take the Lease over",
        )
        specs = watch.specs()
    held = [s["holderIdentity"] for s in specs]
    assert "" not in held, held  # nobody released it
    last_renewal = max(micro_time(s["renewTime"]) for s in specs if s["holderIdentity"] == holder)
    taken = next(s for s in specs if s["holderIdentity"] == new)
    acquired = micro_time(taken["acquireTime"])
    print(f"kill -9: taken over {acquired - killed:.2f}s after the kill")
    # Both stamps are this machine's wall clock (the two replicas'); 0.1 s of slack for
    # the order in which each replica reads it.
    assert acquired - last_renewal >= RECORDED_LEASE_S - 0.1
    assert acquired - killed <= TAKEOVER_BOUND_S + MARGIN_S
    assert taken["leaseTransitions"] == before["spec"]["leaseTransitions"] + 1

    scene.delete_pod(_agent_pod_name(scene, nodes[1]))
    scene.wait_condition(nodes[1], "Unknown", "AgentMissing")
    wait_until(
        lambda: [e for e in scene.node_events(nodes[1]) if e["reportingInstance"] == new],
        what="an Event from the new leader",
    )
    if scene.installed_kinds() >= {"ValidatingAdmissionPolicy"}:
        old = scene.tokens[int(_pod_of(holder).rsplit("-", 1)[1])]
        patch = {"status": {"conditions": [{"type": "GPUPowerCapEnforced", "$patch": "delete"}]}}
        with pytest.raises(ApiError) as refused:
            scene.patch_as(old, f"/api/v1/nodes/{nodes[0]}/status", patch)
        assert refused.value.status == 403
        assert "capwatch fencing" in refused.value.body


def _agent_pod_name(scene: Scene, node: str) -> str:
    selector = ",".join(f"{k}={v}" for k, v in scene.release.pod_labels("DaemonSet").items())
    pods = scene.plane.request(
        "GET",
        f"/api/v1/namespaces/{scene.namespace}/pods?labelSelector={selector}"
        f"&fieldSelector=spec.nodeName={node}",
    )["items"]
    (pod,) = pods
    return str(pod["metadata"]["name"])


READY = {
    "type": "Ready",
    "status": "True",
    "reason": "KubeletReady",
    "message": "kubelet is posting ready status",
    "lastHeartbeatTime": "2025-03-01T10:00:00Z",
    "lastTransitionTime": "2025-03-01T10:00:00Z",
}


def _others(scene: Scene, node: str) -> list[dict[str, str]]:
    conditions = scene.node(node)["status"]["conditions"]
    return [c for c in conditions if c["type"] != "GPUPowerCapEnforced"]


def _said(scene: Scene, node: str) -> list[tuple[str, str]]:
    return [(e["type"], e["reason"]) for e in scene.node_events(node)]


def test_condition_times_and_events_on_the_real_server(scene: Scene) -> None:
    """The leader's server-side apply of nodes/<n>/status adds GPUPowerCapEnforced
    beside the kubelet's Ready (left exactly as it was) and replaces it in place after.
    The heartbeat (2 s here) moves lastHeartbeatTime and nothing else; lastTransitionTime
    moves when the status does (True -> Unknown -> True) and not when only the reason does
    (AgentMissing -> AgentUnreachable). Each change of status or reason is one Event that
    `kubectl describe node` finds (Warning for Unknown, Normal back to True; none for the
    first True), posted by the controller, once each though AgentMissing came twice."""
    prefix = unique("gpu")
    scene.pool(prefix, 1)
    node = f"{prefix}0"
    scene.gpu_node(node, conditions=[READY])
    agent = scene.agent_pod(node, scene.loopback.ip(1))["metadata"]["name"]
    scene.wait_cycled([node])  # so that its first condition is True, not AgentStarting
    scene.controller(0, heartbeat_s=2.0)
    first = scene.wait_condition(node, "True", "CapsEnforced", timeout=START_S)
    assert _others(scene, node) == [READY]
    beat = wait_until(
        lambda: (
            (c := scene.condition(node))
            and c["lastHeartbeatTime"] > first["lastHeartbeatTime"]
            and c
        ),
        timeout=15,
        what="a heartbeat",
    )
    assert {**beat, "lastHeartbeatTime": None} == {**first, "lastHeartbeatTime": None}

    scene.delete_pod(agent)
    missing = scene.wait_condition(node, "Unknown", "AgentMissing")
    assert missing["lastTransitionTime"] > first["lastTransitionTime"]
    dead = scene.agent_pod(node, scene.loopback.ip(2))["metadata"]["name"]  # nothing listens
    unreachable = scene.wait_condition(node, "Unknown", "AgentUnreachable")
    assert unreachable["lastTransitionTime"] == missing["lastTransitionTime"]
    # A second apart at least, so that the next transition's whole-second stamp differs.
    wait_until(lambda: time.time() > micro_time(missing["lastTransitionTime"]) + 1.5, what="1.5 s")
    scene.delete_pod(dead)
    scene.wait_condition(node, "Unknown", "AgentMissing")
    scene.agent_pod(node, scene.loopback.ip(1))
    back = scene.wait_condition(node, "True", "CapsEnforced")
    assert back["lastTransitionTime"] > missing["lastTransitionTime"]
    assert _others(scene, node) == [READY]
    # One of each (the real server's merge puts the patched one first; order means nothing).
    assert sorted(c["type"] for c in scene.node(node)["status"]["conditions"]) == [
        "GPUPowerCapEnforced",
        "Ready",
    ]

    expected = [
        ("Warning", "AgentMissing"),
        ("Warning", "AgentUnreachable"),
        ("Normal", "CapsEnforced"),
    ]
    wait_until(
        lambda: _said(scene, node) == expected, what=f"{expected} (now {_said(scene, node)})"
    )
    for event in scene.node_events(node):
        assert event["metadata"]["namespace"] == "default"
        assert event["involvedObject"] == {
            "apiVersion": "v1", "kind": "Node", "name": node, "uid": node,
        }  # fmt: skip
        assert event["source"]["component"] == f"{scene.release.name}-controller"
        assert event["reportingComponent"] == f"capwatch.io/{scene.release.name}-controller"
        assert event["count"] == 1
        assert event["message"]


def test_events_of_a_node_with_the_longest_name_the_api_allows(scene: Scene) -> None:
    """A GPU node named with all 253 characters a Node name may have, and no agent: the
    controller writes it AgentMissing, and its Event (named after the node, which makes
    the Event's name longer than the node's) is accepted by the API server and found by
    the describe selector."""
    stem = unique("long")
    node = stem + "a" * (253 - len(stem))
    scene.gpu_node(node)
    scene.controller(0)
    scene.wait_condition(node, "Unknown", "AgentMissing", timeout=START_S)
    wait_until(lambda: _said(scene, node) == [("Warning", "AgentMissing")], what="the Event")
    (event,) = scene.node_events(node)
    assert event["metadata"]["name"].startswith(f"{node}.")


def test_the_pool_serves_a_node_with_the_longest_name_the_api_allows(scene: Scene) -> None:
    """The API server takes a 253-character Node name; ``capwatch pool`` serves a node of
    that name, so the controller can follow it and write it True."""
    stem = unique("long")
    prefix = stem + "a" * (252 - len(stem))
    scene.gpu_node(prefix + "0")  # the real server's word: a valid Node name
    pool = scene.pool(prefix, 1)
    scene.wait_cycled([prefix + "0"])
    assert pool.popen.poll() is None


def test_cleanup_removes_the_condition_as_the_hook_account(scene: Scene) -> None:
    """After the controller has written GPUPowerCapEnforced and stopped, the post-delete
    hook's command (the Job's args, as the hook's own ServiceAccount) removes it from every
    node carrying it, a node no longer labelled for GPUs included, and leaves the kubelet's
    conditions; a second run finds nothing to remove."""
    nodes = _agents(scene, 2)
    for node in nodes:
        scene.plane.request(
            "PUT",
            f"/api/v1/nodes/{node}/status",
            {**scene.node(node), "status": {"conditions": [READY]}},
        )
    controller = scene.controller(0)
    for node in nodes:
        scene.wait_condition(node, "True", "CapsEnforced", timeout=START_S)
    controller.signal(signal.SIGTERM)
    assert controller.wait(timeout=30) == 0
    relabelled = scene.node(nodes[1])
    relabelled["metadata"]["labels"] = {}
    scene.plane.request("PUT", f"/api/v1/nodes/{nodes[1]}", relabelled)

    done = scene.cleanup()
    assert done.returncode == 0, done.stdout + done.stderr
    line, rules = done.stdout.splitlines()
    assert line.startswith("removed GPUPowerCapEnforced from "), line
    assert rules == "removed 0 of 0 DeviceTaintRules", rules
    for node in nodes:
        assert scene.condition(node) is None
        assert _others(scene, node) == [READY]
    again = scene.cleanup()
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.startswith("removed GPUPowerCapEnforced from 0 of "), again.stdout
