"""The controller's fencing policy as the chart renders it (controller-fencing.yaml): what
it matches, one binding per shard, and the identity the controller campaigns with."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.controller_support import NAME, _container, _settings, pod_uid
from tests.chart.support import NAMESPACE, RELEASE, Helm, Manifests

POLICY = "ValidatingAdmissionPolicy"
BINDING = "ValidatingAdmissionPolicyBinding"


def _render(helm: Helm, *flags: str) -> Manifests:
    return helm.render("--set", "controller.enabled=true", *flags)


def _fenced(helm: Helm, shards: int) -> Manifests:
    return _render(
        helm,
        "--set",
        f"controller.shards={shards}",
        "--set",
        "controller.fencing.admissionPolicy=true",
    )


@pytest.mark.parametrize("shards", [1, 3])
def test_one_policy_and_binding_per_shard_plus_the_identity_check(helm: Helm, shards: int):
    """With N shards: the identity policy and N shard policies, each with its binding;
    shard K's binding takes Lease capwatch-controller-K in the release namespace as its
    parameter and shard K's policy matches only the requests of ordinals = K mod N."""
    manifests = _fenced(helm, shards)
    policies = {p["metadata"]["name"]: p for p in manifests.of_kind(POLICY)}
    bindings = {b["metadata"]["name"]: b for b in manifests.of_kind(BINDING)}
    assert (
        set(policies)
        == set(bindings)
        == {
            f"{NAME}-fencing",
            *(f"{NAME}-fencing-{k}" for k in range(shards)),
        }
    )
    for shard in range(shards):
        binding = bindings[f"{NAME}-fencing-{shard}"]["spec"]
        assert binding["policyName"] == f"{NAME}-fencing-{shard}"
        assert binding["validationActions"] == ["Deny"]
        assert binding["paramRef"]["name"] == f"{RELEASE}-controller-{shard}-of-{shards}"
        assert binding["paramRef"]["namespace"] == NAMESPACE
        policy = policies[f"{NAME}-fencing-{shard}"]["spec"]
        assert policy["failurePolicy"] == "Fail"
        assert policy["paramKind"] == {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"}
        conditions = [c["expression"] for c in policy["matchConditions"]]
        assert f"system:serviceaccount:{NAMESPACE}:{NAME}" in conditions[0]
        assert conditions[1].endswith(f"% {shards} == {shard}")
    assert "paramRef" not in bindings[f"{NAME}-fencing"]["spec"]


def test_the_policy_watches_everything_the_controller_writes(helm: Helm):
    """What is fenced is exactly what the controller writes: UPDATE (a PATCH is one) of
    nodes/status, CREATE of core Events, and CREATE, UPDATE and DELETE of
    DeviceTaintRules."""
    for policy in _fenced(helm, 2).of_kind(POLICY):
        rules: list[dict[str, Any]] = policy["spec"]["matchConstraints"]["resourceRules"]
        assert {(r["resources"][0], op) for r in rules for op in r["operations"]} == {
            ("nodes/status", "UPDATE"),
            ("events", "CREATE"),
            ("devicetaintrules", "CREATE"),
            ("devicetaintrules", "UPDATE"),
            ("devicetaintrules", "DELETE"),
        }


def test_off_renders_no_policy(helm: Helm):
    """controller.fencing.admissionPolicy=false: no policy or binding (the controller's
    own fence remains)."""
    manifests = _render(helm, "--set", "controller.fencing.admissionPolicy=false")
    assert manifests.of_kind(POLICY) == manifests.of_kind(BINDING) == []


def test_the_lease_identity_is_the_pods_name_and_uid(helm: Helm):
    """From the downward API (POD_NAME, POD_UID) the controller's identity is exactly
    <pod name>_<pod uid>: what the policy builds from the request's pod-bound token."""
    container = _container(_fenced(helm, 2))
    settings = _settings(container, f"{NAME}-1")
    assert settings.identity == f"{NAME}-1_{pod_uid(f'{NAME}-1')}"
