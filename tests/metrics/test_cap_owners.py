"""The cap gauges name their GPU's one owner pod, with one series per GPU whoever owns it."""

from __future__ import annotations

import dataclasses

import pytest

from capwatch.agent.dra.claims import ClaimRef
from capwatch.agent.pods import PodRef
from capwatch.agent.reports import CapSource, GpuResult, Outcome, Reason
from capwatch.server.metrics.scrape_series import GpuCaps, next_caps
from tests.metrics.churn import churn
from tests.metrics.conftest import Followed
from tests.metrics.support import series_of
from tests.server.harness import POD, UUIDS, failed, idle, ok, released

CAP_GAUGES = ("capwatch_gpu_resolved_cap_watts", "capwatch_gpu_applied_cap_watts")
OTHER = PodRef(namespace="inference", name="server-a", uid="bbbbbbbb-0000-4000-8000-000000000001")


def owned_by(result: GpuResult, *owners: PodRef) -> GpuResult:
    return dataclasses.replace(result, owners=owners)


async def gauges(followed: Followed) -> dict[str, dict[str, dict[str, str]]]:
    """Per gauge: GPU index -> that GPU's labels; fails if a GPU has more than one series."""
    found = await followed.settle()
    out: dict[str, dict[str, dict[str, str]]] = {}
    for name in CAP_GAUGES:
        by_gpu: dict[str, dict[str, str]] = {}
        for labels in series_of(found, name):
            series = dict(labels)
            assert series["gpu"] not in by_gpu, f"{name}: two series for GPU {series['gpu']}"
            by_gpu[series["gpu"]] = series
        out[name] = by_gpu
    return out


@pytest.mark.asyncio
async def test_one_owner_is_named_on_both_gauges(followed: Followed):
    """An enforced step with one owner pod puts its namespace and name on both cap gauges."""
    followed.harness.publish([ok(0, 400), idle(1), idle(2)])
    found = await gauges(followed)
    for name in CAP_GAUGES:
        assert found[name]["0"] == {
            "gpu": "0",
            "uuid": UUIDS[0],
            "namespace": POD.namespace,
            "pod": POD.name,
            "source": "annotation",
            "claim": "",
        }
        assert (found[name]["1"]["namespace"], found[name]["1"]["pod"]) == ("", "")
        assert (found[name]["1"]["source"], found[name]["1"]["claim"]) == ("", "")


@pytest.mark.asyncio
async def test_a_claims_cap_is_labelled_with_its_source_and_claims(followed: Followed):
    """A cap asked on ResourceClaims says so on both gauges (source claim, the claims by
    namespace/name), and a failed step after it keeps the source of the cap in force."""
    claimed = dataclasses.replace(
        ok(0, 450),
        cap_source=CapSource.CLAIM,
        claims=(ClaimRef(namespace="ml", name="a"), ClaimRef(namespace="ml", name="b")),
    )
    followed.harness.publish([claimed, idle(1), idle(2)])
    found = await gauges(followed)
    for name in CAP_GAUGES:
        assert (found[name]["0"]["source"], found[name]["0"]["claim"]) == ("claim", "ml/a,ml/b")
    followed.harness.publish([failed(0), idle(1), idle(2)])
    found = await gauges(followed)
    assert (found[CAP_GAUGES[1]]["0"]["source"], found[CAP_GAUGES[1]]["0"]["claim"]) == (
        "claim",
        "ml/a,ml/b",
    )


@pytest.mark.asyncio
async def test_several_owners_leave_the_pod_labels_empty(followed: Followed):
    """A GPU shared by two pods names neither (the cap is theirs jointly), and keeps its value."""
    followed.harness.publish([owned_by(ok(0, 350), POD, OTHER), idle(1), idle(2)])
    labels = (await gauges(followed))[CAP_GAUGES[1]]["0"]
    assert (labels["namespace"], labels["pod"]) == ("", "")
    found = await followed.settle()
    assert series_of(found, CAP_GAUGES[1])[frozenset(labels.items())] == 350.0


@pytest.mark.asyncio
async def test_a_new_owner_replaces_the_series_and_the_old_one_is_gone(followed: Followed):
    """When GPU 0 passes from one pod to another, the next scrape has only the new owner's
    series: the old owner's is not left behind (nor on idle or released steps)."""
    h = followed.harness
    h.publish([ok(0, 400), idle(1), idle(2)])
    assert (await gauges(followed))[CAP_GAUGES[1]]["0"]["pod"] == POD.name
    h.publish([owned_by(ok(0, 300), OTHER), idle(1), idle(2)])
    found = await gauges(followed)
    for name in CAP_GAUGES:
        assert len(found[name]) == 3
        assert (found[name]["0"]["namespace"], found[name]["0"]["pod"]) == (
            OTHER.namespace,
            OTHER.name,
        )
    h.publish([released(0), idle(1), idle(2)])
    found = await gauges(followed)
    assert (found[CAP_GAUGES[0]]["0"]["namespace"], found[CAP_GAUGES[0]]["0"]["pod"]) == ("", "")


def test_a_failed_write_names_the_pod_it_was_for():
    """A failed write for a new owner names that owner and keeps the last applied value; a
    step that failed before it learnt anything (no owners, nothing resolved) keeps the owner."""
    before = GpuCaps(uuid=UUIDS[0], resolved_watts=400, applied_watts=400, owner=POD)
    after = next_caps(before, owned_by(failed(0), OTHER))
    assert after == GpuCaps(uuid=UUIDS[0], resolved_watts=350, applied_watts=400, owner=OTHER)
    blind = GpuResult(
        index=0,
        uuid=UUIDS[0],
        outcome=Outcome.FAILED,
        reason=Reason.PROCESS_LIST_FAILED,
        message="x",
    )
    assert next_caps(before, blind) == before


def test_idle_clears_the_owner():
    """An idle step holds no cap for anyone: the values are NaN and the owner is gone."""
    before = GpuCaps(uuid=UUIDS[0], resolved_watts=400, applied_watts=400, owner=POD)
    after = next_caps(before, idle(0))
    assert after.owner is None
    assert after == GpuCaps(uuid=UUIDS[0])


def test_110_pods_over_8_gpus_keep_one_cap_series_per_gpu():
    """110 pods taking turns on 8 GPUs (alone, shared, idle between) for 330 cycles: every
    scrape serves 8 series per cap gauge, and the whole exposition is as large after the churn
    as it was before it (no series is left behind by a pod that went)."""
    figures = churn(gpus=8, pods=110, cycles=330)
    assert figures.owners_seen == 110  # every pod owned a GPU at some scrape
    assert figures.most_cap_series == 2 * 8
    assert figures.series_after == figures.series_before
    assert figures.most_series == figures.series_before
