"""Caps from DRA ResourceClaims (agent/dra/claims.py): the PowerCap parameters, the join of
claims and this node's ResourceSlices, and the precedence over annotations
(agent/capping.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from capwatch.agent.capping import DEFAULT_ANNOTATION_KEY, resolve_cap
from capwatch.agent.dra.claims import (
    API_VERSION,
    KIND,
    ClaimCap,
    ClaimProblemKind,
    ClaimRef,
    parse_power_cap,
)
from capwatch.agent.dra.slices import DeviceName
from capwatch.agent.gpus import PowerConstraints
from capwatch.agent.pods import PodInfo
from capwatch.agent.reports import CapSource, SafeDefaultCause
from tests.claims_objects import GPU, NODE, POD, UUIDS, capwatch, claim, join, power_cap, slice_of

H100 = PowerConstraints(min_milliwatts=200_000, max_milliwatts=700_000, default_milliwatts=700_000)


@pytest.mark.parametrize(
    ("parameters", "watts", "problem"),
    [
        (power_cap(450), 450, None),
        (power_cap(1), 1, None),
        (power_cap(100_000), 100_000, None),
        (power_cap(0), None, "watts 0 is out of range (1 to 100000)"),
        (power_cap(100_001), None, "watts 100001 is out of range (1 to 100000)"),
        (power_cap("450"), None, "watts '450' is not an integer"),
        (power_cap(450.0), 450, None),
        (power_cap(450.5), None, "watts 450.5 is not an integer"),
        (power_cap(True), None, "watts True is not an integer"),
        (power_cap(None), None, "watts None is not an integer"),
        (power_cap(450, kind="Other"), None, "kind 'Other' is not PowerCap"),
        (power_cap(450, apiVersion="capwatch.io/v2"), None, "apiVersion 'capwatch.io/v2' is"),
        (power_cap(450, milliwatts=1), None, "unknown field 'milliwatts'"),
        ([450], None, "parameters are not an object"),
    ],
)
def test_power_cap_parameters_are_a_whole_number_of_watts_or_a_named_problem(
    parameters: Any, watts: int | None, problem: str | None
):
    """Only apiVersion capwatch.io/v1alpha1, kind PowerCap and an integer ``watts`` in
    1..100,000 is a cap; anything else is refused with a line saying why."""
    got_watts, got_problem = parse_power_cap(parameters)
    assert got_watts == watts
    if problem is None:
        assert got_problem is None
    else:
        assert got_problem is not None
        assert got_problem.startswith(problem)


def test_a_claims_devices_map_to_uuids_through_this_nodes_slices():
    """Each allocated device of this node's pool is joined to its slice's uuid attribute:
    per device its own cap (a claim with two requests gets two caps), the reserved pods
    kept, and the driver's name for every GPU of the slice."""
    snapshot = join(
        [
            claim(
                "two-gpus",
                {"a": "gpu-1", "b": "gpu-2"},
                config=[capwatch(power_cap(400), "a"), capwatch(power_cap(500), "b")],
            )
        ],
        [slice_of()],
    )
    assert {
        u: [(c.claim.name, c.request, c.watts) for c in caps] for u, caps in snapshot.caps.items()
    } == {
        UUIDS[1]: [("two-gpus", "a", 400)],
        UUIDS[2]: [("two-gpus", "b", 500)],
    }
    assert snapshot.caps[UUIDS[1]][0].pods == (POD,)
    assert snapshot.names[UUIDS[3]] == DeviceName(driver=GPU, pool=NODE, device="gpu-3")
    assert snapshot.problems == ()


def test_a_config_naming_no_request_applies_to_all_and_the_last_one_wins():
    """A capwatch.io config with no requests applies to every request; of several that
    apply, the last one counts (as DRA applies configs in order)."""
    snapshot = join(
        [
            claim(
                "c",
                {"gpu": "gpu-0"},
                config=[capwatch(power_cap(300)), capwatch(power_cap(350), "gpu")],
            )
        ],
        [slice_of()],
    )
    assert [c.watts for c in snapshot.caps[UUIDS[0]]] == [350]


def test_claims_without_a_capwatch_config_are_not_caps():
    """Another driver's opaque config, no config at all, or an unallocated claim: none of
    them asks this node for a cap (and none is a problem)."""
    other_driver = {"requests": [], "opaque": {"driver": GPU, "parameters": {"sharing": "x"}}}
    unallocated = claim("pending", {"gpu": "gpu-0"})
    del unallocated["status"]["allocation"]
    snapshot = join(
        [
            claim("plain", {"gpu": "gpu-0"}),
            claim("theirs", {"gpu": "gpu-1"}, config=[other_driver]),
            unallocated,
        ],
        [slice_of(), slice_of("n2")],
    )
    assert snapshot.caps == {}
    assert snapshot.problems == ()


@pytest.mark.parametrize(
    ("device", "pool", "attribute", "why"),
    [
        ("gpu-9", NODE, "uuid", f"device gpu-9 is not in pool {GPU}/{NODE} generation 1"),
        ("gpu-0", NODE, "serial", f"device {GPU}/{NODE}/gpu-0 has no 'uuid' attribute"),
        ("gpu-0", "n2", "uuid", f"no ResourceSlice of this node lists pool {GPU}/n2"),
    ],
)
def test_a_capped_device_no_slice_resolves_is_named_and_holds_its_pods(
    device: str, pool: str, attribute: str, why: str
):
    """A claim's capped device that this node's slices do not resolve (not in the pool,
    no UUID attribute, a pool no slice of this node lists) is a named problem, claim and
    device, and its pods are held: their GPUs keep their caps."""
    snapshot = join(
        [claim("c", {"gpu": device}, config=[capwatch(power_cap(300))], pool=pool)],
        [slice_of(attribute=attribute), slice_of("n2")],
    )
    (lost,) = snapshot.problems
    assert lost.kind is ClaimProblemKind.UNMAPPED
    assert (str(lost.claim), str(lost.device), lost.detail) == (
        "ml/c",
        f"{GPU}/{pool}/{device}",
        why,
    )
    assert snapshot.caps == {}
    assert snapshot.hold([POD.uid]) is lost


@pytest.mark.parametrize("attribute", ["uuid", "gpu.nvidia.com/uuid"])
def test_the_uuid_attribute_may_be_qualified_by_the_drivers_domain(attribute: str):
    """An unqualified attribute name is in the driver's domain: a slice that writes it
    either way is read the same."""
    snapshot = join(
        [claim("c", {"gpu": "gpu-0"}, config=[capwatch(power_cap(300))])],
        [slice_of(attribute=attribute)],
    )
    assert list(snapshot.caps) == [UUIDS[0]]


# --- the precedence: claims first, then annotations ---------------------------------------

C1, C2 = ClaimRef(namespace="ml", name="c1"), ClaimRef(namespace="ml", name="c2")


def cap(ref: ClaimRef, watts: int | None, problem: str | None = None) -> ClaimCap:
    return ClaimCap(claim=ref, request="gpu", watts=watts, problem=problem, pods=(POD,))


def annotated(value: str) -> PodInfo:
    return PodInfo(ref=POD, annotations={DEFAULT_ANNOTATION_KEY: value})


@pytest.mark.parametrize(
    ("claims", "pods", "source", "cause", "watts", "named"),
    [
        ([cap(C1, 450)], [], CapSource.CLAIM, None, 450, ["ml/c1"]),
        ([cap(C1, 450)], [annotated("350")], CapSource.CLAIM, None, 450, ["ml/c1"]),
        ([cap(C1, 450), cap(C2, 450)], [], CapSource.CLAIM, None, 450, ["ml/c1", "ml/c2"]),
        (
            [cap(C1, 450), cap(C2, 400)],
            [annotated("400")],
            CapSource.SAFE_DEFAULT,
            SafeDefaultCause.DISAGREE,
            300,
            ["ml/c1", "ml/c2"],
        ),
        (
            [cap(C1, None, "watts 'x' is not an integer")],
            [annotated("350")],
            CapSource.SAFE_DEFAULT,
            SafeDefaultCause.INVALID,
            300,
            ["ml/c1"],
        ),
        ([], [annotated("350")], CapSource.ANNOTATION, None, 350, []),
        ([], [], CapSource.SAFE_DEFAULT, SafeDefaultCause.NO_POD, 300, []),
    ],
)
def test_claims_decide_before_annotations(
    claims: list[ClaimCap],
    pods: list[PodInfo],
    source: CapSource,
    cause: SafeDefaultCause | None,
    watts: int,
    named: list[str],
):
    """A claim's cap for its device wins over any annotation on that GPU; claims that
    agree give their value; a claim's invalid PowerCap, or claims that disagree, give
    the safe default with the claims named; without claims, annotations as before."""
    decision = resolve_cap(
        pods,
        annotation_key=DEFAULT_ANNOTATION_KEY,
        safe_default_watts=300,
        constraints=H100,
        claims=claims,
    )
    assert (decision.source, decision.safe_default_cause) == (source, cause)
    assert decision.resolved_watts == watts
    assert [str(c) for c in decision.claims] == named
    if cause is SafeDefaultCause.INVALID:
        assert decision.problem == "claim ml/c1: watts 'x' is not an integer"
    if cause is SafeDefaultCause.DISAGREE and named:
        assert decision.problem == "claims disagree: ml/c1 450 W, ml/c2 400 W"


def test_a_claims_cap_is_clamped_to_the_gpus_range():
    """A claim asking more than the GPU's maximum gets the maximum, clamped as any cap."""
    decision = resolve_cap(
        [],
        annotation_key=DEFAULT_ANNOTATION_KEY,
        safe_default_watts=300,
        constraints=H100,
        claims=[cap(C1, 900)],
    )
    assert (decision.requested_watts, decision.target_milliwatts) == (900, 700_000)


SCHEMA = json.loads(
    (Path(__file__).parent.parent / "docs/schemas/powercap-v1alpha1.json").read_text()
)


@pytest.mark.parametrize(
    "parameters",
    [
        power_cap(450),
        power_cap(1),
        power_cap(100_000),
        power_cap(0),
        power_cap(100_001),
        power_cap("450"),
        power_cap(450.0),
        power_cap(450.5),
        power_cap(True),
        power_cap(None),
        power_cap(450, kind="Other"),
        power_cap(450, apiVersion="capwatch.io/v2"),
        power_cap(450, milliwatts=1),
        {"apiVersion": API_VERSION, "kind": KIND},
        [450],
        "450",
    ],
)
def test_the_published_json_schema_and_the_agent_agree_on_what_is_valid(parameters: Any):
    """docs/schemas/powercap-v1alpha1.json accepts exactly the parameters the agent takes
    as a cap, so a user validating against the schema is told what the agent will do."""
    validator = jsonschema.Draft202012Validator(SCHEMA)
    watts, _ = parse_power_cap(parameters)
    assert validator.is_valid(parameters) == (watts is not None)


def test_a_capwatch_config_without_parameters_is_an_invalid_request_not_none():
    """A capwatch.io config that applies to the request but carries no parameters asks
    capwatch for something it cannot read: the claim is named with the problem, not
    skipped as if it asked nothing."""
    empty = {"source": "FromClaim", "requests": [], "opaque": {"driver": "capwatch.io"}}
    snapshot = join([claim("c", {"gpu": "gpu-0"}, config=[empty])], [slice_of()])
    (found,) = snapshot.caps[UUIDS[0]]
    assert (found.watts, found.problem) == (None, "parameters are not an object")
