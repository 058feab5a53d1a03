"""DeviceTaintRules by server-side apply on a real kube-apiserver (the fake models no field
ownership): the controller's API client creates a rule by applying it, applies a change
to it, and is refused, not forced, once another field manager owns a field it sets."""

from __future__ import annotations

import pytest

from capwatch.controller.errors import FieldConflict
from capwatch.controller.kube import TAINT_RULES, KubeApi
from capwatch.controller.taints import DeviceTaint, Effect, TaintPolicy, rule_object
from tests.kube.rawapi import call
from tests.kube.realserver import RealApiServer

pytestmark = pytest.mark.timeout(120)

POLICY = TaintPolicy(release="ssa")


def _taint(effect: Effect) -> DeviceTaint:
    return DeviceTaint(
        node="ssa-node", index=0, uuid="GPU-0", driver="gpu.nvidia.com", pool="ssa-node",
        device="gpu-0", category="xid", effect=effect, faults=("XID 79",),
    )  # fmt: skip


def _managers(rule: dict[str, object]) -> set[tuple[str, str]]:
    fields = rule["metadata"]["managedFields"]  # type: ignore[index]
    return {(m["manager"], m["operation"]) for m in fields}


@pytest.mark.asyncio
async def test_a_rule_is_applied_changed_and_never_forced(real: RealApiServer) -> None:
    """The first apply creates the rule (managedFields: capwatch's release manager,
    Apply); a second with another effect changes it in place. Someone's ``kubectl edit``
    then sets the effect (an Update by manager kubectl-edit): capwatch's next apply is
    refused 409 as a FieldConflict naming kubectl-edit, and the edit stands."""
    api = KubeApi(real.client("capwatch-controller/r0"), namespace="default", identity="r0",
                  release="ssa")  # fmt: skip
    name = _taint(Effect.NONE).name(POLICY.release)
    path = f"{TAINT_RULES}/{name}"
    try:
        created = await api.apply_taint_rule(
            name, rule_object(_taint(Effect.NONE), POLICY), deadline_s=10
        )
        assert _managers(created) == {("ssa-controller", "Apply")}
        changed = await api.apply_taint_rule(
            name, rule_object(_taint(Effect.NO_SCHEDULE), POLICY), deadline_s=10
        )
        assert changed["spec"]["taint"]["effect"] == "NoSchedule"
        assert changed["metadata"]["uid"] == created["metadata"]["uid"]

        edited = dict(changed)
        edited["spec"] = {**changed["spec"], "taint": {**changed["spec"]["taint"],
                                                       "effect": "NoExecute"}}  # fmt: skip
        editor = real.client("kubectl/v1.37")
        answer = call(editor, "PUT", path, query={"fieldManager": "kubectl-edit"}, body=edited)
        assert answer.status == 200, answer.body

        with pytest.raises(FieldConflict) as refused:
            await api.apply_taint_rule(
                name, rule_object(_taint(Effect.NO_SCHEDULE), POLICY), deadline_s=10
            )
        assert refused.value.managers == ("kubectl-edit",)
        kept = call(editor, "GET", path).body
        assert kept["spec"]["taint"]["effect"] == "NoExecute"
    finally:
        call(real.client("cleanup"), "DELETE", path)
        api.close()
