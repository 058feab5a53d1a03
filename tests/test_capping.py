"""Cap policy: annotation parsing, multi-pod agreement, safe default, clamping."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capwatch.agent.capping import DEFAULT_ANNOTATION_KEY, CapBounds, parse_watts, resolve_cap
from capwatch.agent.dra.claims import ClaimCap, ClaimRef
from capwatch.agent.gpus import PowerConstraints
from capwatch.agent.pods import PodInfo, PodRef
from capwatch.agent.reports import CapSource, ClampDirection, SafeDefaultCause

KEY = DEFAULT_ANNOTATION_KEY
H100 = PowerConstraints(min_milliwatts=200_000, max_milliwatts=700_000, default_milliwatts=700_000)


def pod(name: str, value: str | None) -> PodInfo:
    annotations = {} if value is None else {KEY: value}
    return PodInfo(
        ref=PodRef(namespace="ns", name=name, uid=f"uid-{name}"), annotations=annotations
    )


def decide(*pods: PodInfo, safe: int = 300, constraints: PowerConstraints = H100):
    return resolve_cap(
        list(pods), annotation_key=KEY, safe_default_watts=safe, constraints=constraints
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("350", 350),
        (" 350 ", 350),
        ("0350", 350),
        ("1", 1),
        ("100000", 100_000),
        ("100001", None),
        ("0", None),
        ("-5", None),
        ("+300", None),
        ("300W", None),
        ("300.0", None),
        ("3e2", None),
        ("1_000", None),
        ("٣٠٠", None),  # Arabic-Indic digits: int() accepts them, we do not
        ("", None),
        ("   ", None),
        ("9" * 40, None),
        (None, None),
    ],
)
def test_parse_watts_accepts_only_plain_positive_integers(text: str | None, expected: int | None):
    """Only ASCII-digit positive integers up to the sanity bound are wattages."""
    assert parse_watts(text) == expected


@pytest.mark.parametrize(
    ("pods", "source", "cause", "requested", "target_mw", "clamp"),
    [
        ([pod("a", "450")], CapSource.ANNOTATION, None, 450, 450_000, ClampDirection.NONE),
        (
            [pod("a", "450"), pod("b", "450")],
            CapSource.AGREED,
            None,
            450,
            450_000,
            ClampDirection.NONE,
        ),
        (
            [pod("a", "450"), pod("b", "500")],
            CapSource.SAFE_DEFAULT,
            SafeDefaultCause.DISAGREE,
            None,
            300_000,
            ClampDirection.NONE,
        ),
        (
            [pod("a", "450"), pod("b", None)],
            CapSource.SAFE_DEFAULT,
            SafeDefaultCause.MISSING,
            None,
            300_000,
            ClampDirection.NONE,
        ),
        (
            [pod("a", "lots")],
            CapSource.SAFE_DEFAULT,
            SafeDefaultCause.INVALID,
            None,
            300_000,
            ClampDirection.NONE,
        ),
        ([], CapSource.SAFE_DEFAULT, SafeDefaultCause.NO_POD, None, 300_000, ClampDirection.NONE),
        (
            [pod("a", "5000")],
            CapSource.ANNOTATION,
            None,
            5000,
            700_000,
            ClampDirection.LOWERED_TO_MAX,
        ),
        ([pod("a", "50")], CapSource.ANNOTATION, None, 50, 200_000, ClampDirection.RAISED_TO_MIN),
    ],
)
def test_resolve_cap_table(pods, source, cause, requested, target_mw, clamp):
    """Each pod combination resolves to the documented source, cause, value and clamp."""
    decision = decide(*pods)
    assert decision.source is source
    assert decision.safe_default_cause is cause
    assert decision.requested_watts == requested
    assert decision.target_milliwatts == target_mw
    assert decision.clamp is clamp


def test_safe_default_is_clamped_too():
    """A safe default outside the GPU's range is clamped like any request."""
    decision = decide(pod("a", None), safe=100)
    assert decision.resolved_watts == 100
    assert decision.target_milliwatts == 200_000
    assert decision.clamp is ClampDirection.RAISED_TO_MIN


def test_other_annotations_are_ignored():
    """Only the configured annotation key is read."""
    other = PodInfo(
        ref=PodRef(namespace="ns", name="a", uid="u"),
        annotations={"example.com/gpu-power-limit": "450"},
    )
    assert decide(other).safe_default_cause is SafeDefaultCause.MISSING


constraints_st = st.tuples(
    st.integers(min_value=1, max_value=2_000_000), st.integers(min_value=0, max_value=2_000_000)
).map(
    lambda t: PowerConstraints(
        min_milliwatts=t[0], max_milliwatts=t[0] + t[1], default_milliwatts=t[0] + t[1]
    )
)


@given(
    values=st.lists(st.one_of(st.none(), st.text(max_size=30)), max_size=5),
    safe=st.integers(min_value=1, max_value=5000),
    constraints=constraints_st,
)
def test_any_annotations_give_a_value_within_constraints(values, safe, constraints):
    """Arbitrary annotation strings never raise and always yield a cap within constraints."""
    pods = [pod(f"p{i}", v) for i, v in enumerate(values)]
    decision = decide(*pods, safe=safe, constraints=constraints)
    assert constraints.min_milliwatts <= decision.target_milliwatts <= constraints.max_milliwatts
    assert 0 < decision.resolved_watts <= 100_000
    if decision.source is CapSource.SAFE_DEFAULT:
        assert decision.resolved_watts == safe


BOUNDS = CapBounds(floor_watts=250, ceiling_watts=450)


@pytest.mark.parametrize(
    ("pods", "claims", "resolved", "written", "clamp"),
    [
        ([pod("a", "600")], [], 600, 450, ClampDirection.LOWERED_TO_CEILING),
        ([pod("a", "220")], [], 220, 250, ClampDirection.RAISED_TO_FLOOR),
        ([pod("a", "300")], [], 300, 300, ClampDirection.NONE),
        ([pod("a", None)], [], 200, 250, ClampDirection.RAISED_TO_FLOOR),
        ([], [("c", 690)], 690, 450, ClampDirection.LOWERED_TO_CEILING),
    ],
)
def test_the_clusters_bounds_apply_to_every_source_and_are_named(
    pods: list[PodInfo],
    claims: list[tuple[str, int]],
    resolved: int,
    written: int,
    clamp: ClampDirection,
):
    """A cap from an annotation, a claim or the safe default (here 200 W) outside the
    cluster's floor and ceiling is written at the bound, and the clamp says which."""
    decision = resolve_cap(
        pods,
        annotation_key=KEY,
        safe_default_watts=200,
        constraints=H100,
        claims=[
            ClaimCap(
                claim=ClaimRef(namespace="ns", name=name), request="gpu", watts=w, problem=None
            )
            for name, w in claims
        ],
        bounds=BOUNDS,
    )
    assert decision.resolved_watts == resolved
    assert (decision.target_milliwatts, decision.clamp) == (written * 1000, clamp)


def test_the_gpus_range_decides_after_the_clusters_bounds():
    """A ceiling above the GPU's maximum: the GPU's maximum is written and the clamp is
    the GPU's; a floor below its minimum: the GPU's minimum, the GPU's clamp."""
    high = CapBounds(ceiling_watts=900)
    low = CapBounds(floor_watts=100)
    for bounds, ask, written, clamp in (
        (high, "1000", 700, ClampDirection.LOWERED_TO_MAX),
        (low, "50", 200, ClampDirection.RAISED_TO_MIN),
    ):
        decision = resolve_cap(
            [pod("a", ask)],
            annotation_key=KEY,
            safe_default_watts=300,
            constraints=H100,
            bounds=bounds,
        )
        assert (decision.target_milliwatts, decision.clamp) == (written * 1000, clamp)


def test_a_floor_above_the_ceiling_is_refused():
    """CapBounds refuses an empty range (the flags are checked before it is built)."""
    with pytest.raises(ValueError, match="floor"):
        CapBounds(floor_watts=500, ceiling_watts=400)
