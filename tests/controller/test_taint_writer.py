"""DeviceTaintRules for faulted GPUs (controller/taints.py, controller/writes/taints.py):
one rule per faulted device a slice names, its effect the operator's per category,
removed after a hold-down or at once when the node goes, written only while leading,
bounded by a rate limit, and nothing for a device no slice names but an Event.

Time is the virtual loop's: hold-downs and the rate limit happen at exact instants."""

from __future__ import annotations

import asyncio

import pytest

from capwatch.controller.errors import FieldConflict
from capwatch.controller.taints import (
    TAINT_KEY,
    Effect,
    TaintPolicy,
    device_taints,
    parse_effect,
    rule_name,
    rule_object,
)
from capwatch.kit.errors import ConfigError
from tests.controller.taints_rig import DRIVER, RELEASE, Rig, failure, gpu, state


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def name(node: str, index: int) -> str:
    return rule_name(RELEASE, DRIVER, node, f"gpu-{index}")


@pytest.mark.asyncio
async def test_a_fault_becomes_one_rule_naming_the_device_with_its_category() -> None:
    """An XID on GPU 1 of n1: one rule selecting gpu.nvidia.com/n1/gpu-1, taint
    capwatch.io/gpu-fault=xid with the default effect None, labelled with the release and
    the node, its annotation saying which GPU and what fault; one Event on the Node."""
    rig = Rig()
    rig.start()
    rig.writer.node_changed(state("n1", [gpu(0), gpu(1, "xid")]))
    await settle()
    (rule,) = rig.api.rules.values()
    assert rule["metadata"]["name"] == name("n1", 1)
    assert rule["spec"] == {
        "deviceSelector": {"driver": DRIVER, "pool": "n1", "device": "gpu-1"},
        "taint": {"key": TAINT_KEY, "value": "xid", "effect": "None"},
    }
    labels = rule["metadata"]["labels"]
    assert labels == {
        "app.kubernetes.io/managed-by": "capwatch",
        "app.kubernetes.io/instance": RELEASE,
        "capwatch.io/node": "n1",
    }
    assert "GPU 1 (GPU-n1-1) on node n1" in rule["metadata"]["annotations"]["capwatch.io/message"]
    assert rig.events.said() == [("n1", "Warning", "DeviceTainted")]
    assert rig.observer.results == [("create", "ok")]
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_the_effect_is_the_operators_per_category_and_the_strongest_wins() -> None:
    """gpu_lost is NoExecute and xid NoSchedule: a GPU with both faults gets the stronger
    effect, named by its category; an ECC fault keeps the default None."""
    rig = Rig(effects={"gpu_lost": Effect.NO_EXECUTE, "xid": Effect.NO_SCHEDULE})
    rig.start()
    rig.writer.node_changed(state("n1", [gpu(0, "xid", "gpu_lost"), gpu(1, "ecc_uncorrected")]))
    await settle()
    assert rig.api.taints() == {
        name("n1", 0): ("gpu-0", "gpu_lost", "NoExecute"),
        name("n1", 1): ("gpu-1", "ecc_uncorrected", "None"),
    }
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_recovery_removes_the_rule_after_the_hold_down_and_a_flap_keeps_it() -> None:
    """The GPU recovers: its rule stays for the hold-down; a fault again within it keeps
    the rule with no write at all; recovered for a whole hold-down, the rule goes."""
    rig = Rig(hold_down_s=60.0)
    rig.start()
    rig.writer.node_changed(state("n1", [gpu(1, "xid")]))
    await settle()
    rig.writer.node_changed(state("n1", [gpu(1)]))
    await asyncio.sleep(30)
    rig.writer.node_changed(state("n1", [gpu(1, "xid")]))
    await asyncio.sleep(40)
    assert rig.api.count("delete") == 0
    assert rig.api.count("create") == 1
    start = rig.clock.monotonic()
    rig.writer.node_changed(state("n1", [gpu(1)]))
    await asyncio.sleep(59)
    assert rig.api.rules
    await asyncio.sleep(2)
    assert rig.api.rules == {}
    (when, action, _) = rig.api.writes[-1]
    assert action == "delete"
    assert when == pytest.approx(start + 60.0, abs=0.01)
    assert ("n1", "Normal", "DeviceTaintRemoved") in rig.events.said()
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_a_node_that_goes_loses_its_rules_at_once() -> None:
    """The node is deleted (or is no GPU node any more): its rules go without a hold-down."""
    rig = Rig(hold_down_s=600.0)
    rig.start()
    rig.writer.node_changed(state("n1", [gpu(0, "gpu_lost"), gpu(1, "xid")]))
    rig.writer.node_changed(state("n2", [gpu(0, "xid", node="n2")]))
    await settle()
    rig.writer.node_removed("n1")
    await settle()
    assert set(rig.api.rules) == {name("n2", 0)}
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_a_standby_never_writes_and_a_new_leader_starts_from_what_is_in_place() -> None:
    """Not leading: nothing is written however many faults. Leading: the rules in place
    are listed first, a rule already right is not written again, the missing ones are
    created."""
    rig = Rig()
    rig.start(leading=False)
    rig.fence.budget = 0
    rig.writer.node_changed(state("n1", [gpu(0, "xid"), gpu(1, "xid")]))
    await asyncio.sleep(5)
    assert rig.api.writes == []
    rig.api.rules[name("n1", 0)] = rule_object(
        device_taints("n1", [gpu(0, "xid")], rig.policy)[0][name("n1", 0)], rig.policy
    )
    rig.api.rules[name("n1", 0)]["metadata"]["resourceVersion"] = "7"
    rig.fence.budget = 10.0
    rig.writer.resume()
    await settle()
    assert rig.api.lists == 1
    assert [(a, n) for _, a, n in rig.api.writes] == [("create", name("n1", 1))]
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_a_rule_whose_node_no_leader_knows_goes_after_the_hold_down() -> None:
    """A rule in place for a node the tracker does not know (deleted while nobody led):
    kept for the hold-down, in case its agent is only slow to answer, then removed; a
    known node's rule is left to its agent's next cycle."""
    rig = Rig(hold_down_s=60.0, known={"n1"})
    policy = rig.policy
    for node in ("n1", "gone"):
        taint = device_taints(node, [gpu(0, "xid", node=node)], policy)[0]
        ((key, wanted),) = taint.items()
        rig.api.rules[key] = rule_object(wanted, policy)
        rig.api.rules[key]["metadata"]["resourceVersion"] = "1"
    rig.start()
    await asyncio.sleep(61)
    assert set(rig.api.rules) == {name("n1", 0)}
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_a_mass_fault_is_one_create_per_gpu_at_the_rate_limit() -> None:
    """1,000 GPUs fault at once (125 nodes): exactly 1,000 creates, no more than the burst
    and the rate allow in any second; recovery: exactly 1,000 deletes, as bounded; one
    Event per node and kind, not per GPU."""
    rig = Rig(hold_down_s=60.0, qps=20.0, burst=40, known={f"n{i}" for i in range(125)})
    rig.start()
    nodes = [f"n{i}" for i in range(125)]
    for node in nodes:
        rig.writer.node_changed(state(node, [gpu(g, "xid", node=node) for g in range(8)]))
    began = rig.clock.monotonic()
    await asyncio.sleep(120)
    assert rig.api.count("create") == 1000
    assert len(rig.api.rules) == 1000
    creates = [when - began for when, action, _ in rig.api.writes if action == "create"]
    assert max(creates) == pytest.approx((1000 - 40) / 20.0, abs=1.0)
    for second in range(int(max(creates)) + 1):
        assert sum(second <= t < second + 1 for t in creates) <= 40 + 20
    for node in nodes:
        rig.writer.node_changed(state(node, [gpu(g, node=node) for g in range(8)]))
    await asyncio.sleep(200)
    assert rig.api.count("delete") == 1000
    assert rig.api.rules == {}
    assert len(rig.api.writes) == 2000
    tainted = [said for said in rig.events.said() if said[2] == "DeviceTainted"]
    assert len(tainted) == 125
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_a_failed_write_is_retried_after_its_backoff() -> None:
    """A 500 on create: retried after the rule's own backoff, and then created once."""
    rig = Rig()
    rig.start()
    rig.api.failures = [failure(500), failure(503)]
    rig.writer.node_changed(state("n1", [gpu(0, "xid")]))
    await asyncio.sleep(10)
    assert rig.api.count("create") == 1
    assert rig.observer.results[:2] == [("create", "failed"), ("create", "failed")]
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_a_field_another_manager_owns_is_not_forced() -> None:
    """The rule is applied, never forced: when the API server answers that another field
    manager owns a field capwatch sets (kubectl edit), the write counts ``conflict``, a
    Warning Event on the Node names the owner, and the rule is tried again at its
    backoff; once the owner lets go, it is applied (created) once."""
    rig = Rig()
    rig.start()
    rig.api.failures = [
        FieldConflict('Apply failed: conflicts with "kubectl-edit"', managers=("kubectl-edit",))
    ]
    rig.writer.node_changed(state("n1", [gpu(0, "xid")]))
    await asyncio.sleep(10)
    assert rig.observer.results == [("create", "conflict"), ("create", "ok")]
    conflict, tainted = rig.events.events
    assert (conflict.type.value, conflict.reason) == ("Warning", "GPUDeviceTaintRuleConflict")
    assert "kubectl-edit owns fields capwatch sets" in conflict.message
    assert tainted.reason == "DeviceTainted"
    assert [a for _, a, _ in rig.api.writes] == ["create"]
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_a_fault_on_a_gpu_no_slice_names_is_an_event_not_a_rule() -> None:
    """No ResourceSlice names the faulted GPU: no rule; one DeviceTaintSkipped Event on the
    Node saying which GPU, which fault and why, not repeated every cycle."""
    rig = Rig()
    rig.start()
    for _ in range(3):
        rig.writer.node_changed(state("n1", [gpu(2, "xid", named=False)]))
        await settle()
    assert rig.api.rules == {}
    (event,) = rig.events.events
    assert (event.type.value, event.reason) == ("Warning", "DeviceTaintSkipped")
    assert "no ResourceSlice of this node names the GPU" in event.message
    await rig.writer.stop()


@pytest.mark.asyncio
async def test_other_shards_and_unconnected_nodes_are_left_alone() -> None:
    """A node of another shard is never tainted; a node whose agent is unreachable keeps
    its rules (nothing is known of its GPUs); tainting off writes nothing."""
    rig = Rig(ours={"n1"})
    rig.start()
    rig.writer.node_changed(state("n2", [gpu(0, "xid", node="n2")]))
    rig.writer.node_changed(state("n1", [gpu(0, "xid")]))
    await settle()
    assert set(rig.api.rules) == {name("n1", 0)}
    from capwatch.controller.conditions import AgentLink

    rig.writer.node_changed(state("n1", [], link=AgentLink.UNREACHABLE))
    await asyncio.sleep(120)
    assert set(rig.api.rules) == {name("n1", 0)}
    await rig.writer.stop()


def test_effects_parse_as_category_equals_effect_or_say_what_is_wrong() -> None:
    """--device-taint-effect takes the stream's category names and the three effects."""
    assert parse_effect("--f", "gpu_lost=NoExecute") == ("gpu_lost", Effect.NO_EXECUTE)
    for bad, says in (
        ("gpu-lost=NoExecute", "CATEGORY one of gpu_lost"),
        ("xid", "want CATEGORY=EFFECT"),
        ("xid=Evict", "the effect must be one of None, NoSchedule, NoExecute"),
    ):
        with pytest.raises(ConfigError, match=says):
            parse_effect("--f", bad)


def test_rule_names_are_stable_per_device_and_release_and_valid() -> None:
    """The same device and release always name the same rule; another release, another
    rule; a pool name too long or odd for a readable name still gives a valid one."""
    assert rule_name("r", DRIVER, "n1", "gpu-0") == rule_name("r", DRIVER, "n1", "gpu-0")
    assert rule_name("r", DRIVER, "n1", "gpu-0") != rule_name("s", DRIVER, "n1", "gpu-0")
    assert rule_name("r", DRIVER, "n1", "gpu-0") != rule_name("r", "other", "n1", "gpu-0")
    odd = rule_name("r", DRIVER, "Node_" + "x" * 300, "gpu-0")
    assert len(odd) <= 253
    assert odd.startswith("r-")
    off = TaintPolicy(release="r", enabled=False)
    assert off.selector() == "app.kubernetes.io/managed-by=capwatch,app.kubernetes.io/instance=r"
