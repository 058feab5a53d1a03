"""The real-node tier: one node (control plane, containerd, runc, kubelet) for the run.

Needs root, the OS packages (containerd, runc, containernetworking-plugins,
iptables), the kubelet and control plane built (make kube), capwatch's image
(make image) and the fake NVML. Without them the tier is skipped with one line
saying what is missing, except in CI (CI=true), where that is a failure.

The node is one per host, so the tier runs serially by construction; the
lifecycle test (its own node, up and down) runs before the shared one starts.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.chart.support import fetch_helm
from tests.fakenvml.build import build as build_fakenvml
from tests.realkube.fixtures import built_binaries, unavailable
from tests.realnode import host
from tests.realnode.cluster import Cluster
from tests.realnode.node import NodeError, RealNode
from tests.realnode.prerequisites import image_archive

ROOT = Path(__file__).resolve().parents[2]
FIRST = "test_lifecycle.py"
LOG_TAIL_LINES = 25
_NODE_KEY = pytest.StashKey[RealNode]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The lifecycle test brings its own node up and down: before the shared node exists."""
    here = Path(__file__).parent
    tier = [item for item in items if item.path.parent == here]
    if not tier:
        return
    first = [item for item in tier if item.path.name == FIRST]
    rest = [item for item in tier if item.path.name != FIRST]
    start = items.index(tier[0])
    others = [item for item in items if item.path.parent != here]
    items[:] = others[:start] + first + rest + others[start:]


@pytest.fixture(scope="session")
def realnode_parts() -> dict[str, Path]:
    """What a node is made of, or a skip (a failure in CI) naming what is missing."""
    try:
        host.check()
    except host.HostError as err:
        unavailable(str(err))
    binaries = built_binaries()
    if "kubelet" not in binaries:
        unavailable("no kubelet among the built binaries: make kube")
    archive = image_archive()
    if not archive.is_file():
        unavailable(f"no image archive at {archive}: make image")
    fakenvml = build_fakenvml(ROOT / "build" / "fakenvml")
    return {**binaries, "image": archive, "fakenvml": fakenvml}


def make_node(directory: Path, parts: dict[str, Path]) -> RealNode:
    binaries = {name: path for name, path in parts.items() if name not in {"image", "fakenvml"}}
    return RealNode(
        directory, binaries=binaries, image_archive=parts["image"], fakenvml=parts["fakenvml"]
    )


@pytest.fixture(scope="session")
def realnode(
    realnode_parts: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """The shared node, up for the rest of the run; down (and checked clean) at the end."""
    node = make_node(tmp_path_factory.mktemp("realnode"), realnode_parts)
    try:
        node.up()
    except NodeError as err:
        pytest.fail(f"the real node did not come up: {err}", pytrace=False)
    try:
        yield Cluster(
            node=node, helm_binary=fetch_helm(), helm_home=tmp_path_factory.mktemp("helm")
        )
    finally:
        node.down()


@pytest.fixture(autouse=True)
def _remember_node(request: pytest.FixtureRequest) -> None:
    """Lets a failing test's report carry the node's container logs."""
    if "realnode" in request.fixturenames:
        request.node.stash[_NODE_KEY] = request.getfixturevalue("realnode").node


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failing test on the node says what its containers said: the last lines of
    every container log the kubelet wrote (a pod that never got Ready says why)."""
    report = yield
    node = item.stash.get(_NODE_KEY, None)
    if node is not None and report.failed and call.when == "call":
        for log in sorted(node.pod_logs.glob("*/*/*.log")):
            lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
            tail = "\n".join(lines[-LOG_TAIL_LINES:])
            report.sections.append((f"container log {log.relative_to(node.pod_logs)}", tail))
    return report
