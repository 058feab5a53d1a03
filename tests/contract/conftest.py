"""Fixtures for the loop-contract tests: a rig per backend, pods, and a reconciler."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from capwatch.agent.attribution import Attributor, FsProcRoot
from capwatch.agent.ownership import LoadStatus, OwnershipStore
from capwatch.agent.pods import PodInfo, PodRef
from capwatch.agent.reconciling import Reconciler
from capwatch.agent.stepping import Policy
from capwatch.kit.clock import FakeClock
from tests.contract.rigs import GPU_COUNT, NvmlRig, Rig, SimRig
from tests.fakes.pods import StaticPodView

KEY = "capwatch.io/gpu-power-limit"
SAFE_W = 250


def _pod(n: int, name: str, annotation: str | None) -> PodInfo:
    uid = f"aaaaaaaa-0000-4000-8000-{n:012d}"
    return PodInfo(
        ref=PodRef(namespace="team", name=name, uid=uid),
        annotations={} if annotation is None else {KEY: annotation},
    )


POD_A = _pod(1, "a", "350")
POD_B = _pod(2, "b", "350")  # agrees with A
POD_C = _pod(3, "c", None)  # no annotation
POD_D = _pod(4, "d", "lots")  # invalid
POD_E = _pod(5, "e", "5000")  # above every GPU's maximum
PODS = (POD_A, POD_B, POD_C, POD_D, POD_E)


@pytest.fixture(params=["sim", "nvml"])
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Rig]:
    """The same fault-injection rig over the simulator and over real pynvml + fake library."""
    proc_root = tmp_path / "proc"
    if request.param == "sim":
        yield SimRig(proc_root)
        return
    request.applymarker(pytest.mark.nvml)
    nvml_rig = NvmlRig(request.getfixturevalue("fake_nvml"), proc_root)
    yield nvml_rig
    nvml_rig.backend.close()


@pytest.fixture
def pods() -> StaticPodView:
    return StaticPodView(PODS)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> OwnershipStore:
    return OwnershipStore(tmp_path / "state", clock=clock)


def make_reconciler(
    rig: Rig,
    pods: StaticPodView,
    store: OwnershipStore,
    clock: FakeClock,
    proc_root: Path,
    *,
    policy: Policy | None = None,
) -> Reconciler:
    status = store.load()
    return Reconciler(
        backend=rig.backend,
        pods=pods,
        attributor=Attributor(FsProcRoot(proc_root)),
        store=store,
        clock=clock,
        policy=policy or Policy(annotation_key=KEY, safe_default_watts=SAFE_W),
        initial_device_count=GPU_COUNT,
        release_unowned_idle=status is LoadStatus.UNREADABLE,
        listeners=rig.listeners,
    )


@pytest.fixture
def reconciler(
    rig: Rig, pods: StaticPodView, store: OwnershipStore, clock: FakeClock, tmp_path: Path
) -> Reconciler:
    return make_reconciler(rig, pods, store, clock, tmp_path / "proc")
