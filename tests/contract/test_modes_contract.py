"""Observe mode and the unclaimed policy, on the simulator and on the real NVML
backend over the fake library: what each writes (the fake's own write log on
NVML), what each step reports, and what the ownership record keeps."""

from __future__ import annotations

from pathlib import Path

from capwatch.agent.capping import Mode, UnclaimedPolicy
from capwatch.agent.ownership import OwnershipStore
from capwatch.agent.reports import CapSource, ClampDirection, Outcome, Reason, SafeDefaultCause
from capwatch.agent.stepping import Policy
from capwatch.kit.clock import FakeClock
from tests.contract.conftest import KEY, POD_A, POD_C, POD_D, POD_E, SAFE_W, make_reconciler
from tests.contract.rigs import DEFAULT_W, MAX_W, UUIDS, Rig, Write
from tests.fakes.pods import StaticPodView

OBSERVE = Policy(annotation_key=KEY, safe_default_watts=SAFE_W, mode=Mode.OBSERVE)
LEAVE = Policy(annotation_key=KEY, safe_default_watts=SAFE_W, unclaimed=UnclaimedPolicy.LEAVE)


def test_observe_mode_writes_nothing_and_says_what_it_would(
    rig: Rig, pods: StaticPodView, store: OwnershipStore, clock: FakeClock, tmp_path: Path
):
    """Every busy GPU reports the cap it would have written (intended, not applied),
    clamps and safe defaults included; the device log has no write at all; the
    record stays empty; the cycle counts as good and says it is an observing one."""
    reconciler = make_reconciler(rig, pods, store, clock, tmp_path / "proc", policy=OBSERVE)
    rig.run(0, {1001: POD_A.ref.uid})
    rig.run(1, {1002: POD_C.ref.uid})
    rig.run(2, {1003: POD_E.ref.uid})
    for _ in range(3):
        report = reconciler.reconcile_once()
    assert report.enforced
    assert report.observe
    g0, g1, g2 = report.gpus
    assert {g.outcome for g in report.gpus} == {Outcome.OBSERVED}
    assert {g.reason for g in report.gpus} == {Reason.OBSERVED}
    assert (g0.intended_watts, g0.applied_watts, g0.cap_source) == (
        350,
        None,
        CapSource.ANNOTATION,
    )
    assert (g1.intended_watts, g1.safe_default_cause) == (SAFE_W, SafeDefaultCause.MISSING)
    assert (g2.intended_watts, g2.clamp) == (MAX_W, ClampDirection.LOWERED_TO_MAX)
    assert g0.message == "would be capped at 350 W (annotation); observe mode"
    assert rig.writes() == []
    assert store.records() == {}
    assert [rig.limit_mw(i) for i in range(3)] == [DEFAULT_W * 1000] * 3


def test_observe_mode_leaves_an_enforcing_agents_caps_and_would_release_them(
    rig: Rig, pods: StaticPodView, store: OwnershipStore, clock: FakeClock, tmp_path: Path
):
    """Switching enforce -> observe: the caps an enforcing agent left stay as they are
    (no write, the record untouched); a GPU whose owner left says it would be released,
    naming the default it would write. Switching back adopts them: an upgrade."""
    enforcing = make_reconciler(rig, pods, store, clock, tmp_path / "proc")
    rig.run(0, {1001: POD_A.ref.uid})
    rig.run(1, {1002: POD_A.ref.uid})
    assert enforcing.reconcile_once().enforced
    written = rig.writes()
    assert len(written) == 2

    observing = make_reconciler(
        rig, pods, OwnershipStore(store.path.parent, clock=clock), clock, tmp_path / "proc",
        policy=OBSERVE,
    )  # fmt: skip
    rig.run(1, {})
    report = observing.reconcile_once()
    assert report.enforced
    g1 = report.gpus[1]
    assert (g1.outcome, g1.intended_watts) == (Outcome.OBSERVED, DEFAULT_W)
    assert g1.message == "would restore the default limit; observe mode"
    assert rig.writes() == written
    assert rig.limit_mw(1) == 350_000

    again = make_reconciler(
        rig, pods, OwnershipStore(store.path.parent, clock=clock), clock, tmp_path / "proc"
    )
    report = again.reconcile_once()
    assert [g.outcome for g in report.gpus] == [Outcome.ENFORCED, Outcome.RELEASED, Outcome.IDLE]
    assert rig.limit_mw(1) == DEFAULT_W * 1000


def test_leave_keeps_the_limit_of_a_gpu_nobody_asks_about(
    rig: Rig, pods: StaticPodView, store: OwnershipStore, clock: FakeClock, tmp_path: Path
):
    """With the unclaimed policy leave, a busy GPU whose pods carry no annotation (and a
    process of no known pod) is left as it is, reason unclaimed, and never written; a pod
    that asks, even invalidly, still gets the policy (an invalid value: the safe default)."""
    reconciler = make_reconciler(rig, pods, store, clock, tmp_path / "proc", policy=LEAVE)
    rig.run(0, {1001: POD_C.ref.uid, 1004: None})
    rig.run(1, {1002: POD_D.ref.uid})
    rig.run(2, {1003: POD_A.ref.uid})
    report = reconciler.reconcile_once()
    assert report.enforced
    g0, g1, g2 = report.gpus
    assert (g0.outcome, g0.reason, g0.applied_watts) == (Outcome.LEFT, Reason.UNCLAIMED, None)
    assert g0.owners == (POD_C.ref,)
    assert "unclaimed policy leave" in g0.message
    assert (g1.outcome, g1.applied_watts, g1.safe_default_cause) == (
        Outcome.ENFORCED,
        SAFE_W,
        SafeDefaultCause.INVALID,
    )
    assert (g2.outcome, g2.applied_watts) == (Outcome.ENFORCED, 350)
    assert rig.writes() == [
        Write(index=1, milliwatts=SAFE_W * 1000, ok=True),
        Write(index=2, milliwatts=350_000, ok=True),
    ]
    assert set(store.records()) == {UUIDS[1], UUIDS[2]}


def test_leave_releases_this_agents_cap_once_nobody_asks(
    rig: Rig, pods: StaticPodView, store: OwnershipStore, clock: FakeClock, tmp_path: Path
):
    """A GPU capped for an annotated pod that left, now running an unannotated one:
    the cap was this agent's, for an owner that is gone, so it is released (the default
    written once), and from then on the GPU is left as it is."""
    reconciler = make_reconciler(rig, pods, store, clock, tmp_path / "proc", policy=LEAVE)
    rig.run(0, {1001: POD_A.ref.uid})
    assert reconciler.reconcile_once().enforced
    rig.run(0, {1002: POD_C.ref.uid})
    released = reconciler.reconcile_once().gpus[0]
    assert (released.outcome, released.reason) == (Outcome.RELEASED, Reason.RELEASED)
    assert released.message.endswith(f"(unclaimed policy leave); default {DEFAULT_W} W restored")
    left = reconciler.reconcile_once().gpus[0]
    assert (left.outcome, left.reason) == (Outcome.LEFT, Reason.UNCLAIMED)
    assert rig.writes() == [
        Write(index=0, milliwatts=350_000, ok=True),
        Write(index=0, milliwatts=DEFAULT_W * 1000, ok=True),
    ]
    assert store.records() == {}
