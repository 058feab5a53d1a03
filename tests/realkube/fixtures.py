"""pytest fixtures: one real control plane per test run, a fresh namespace per test.

Wire them in from tests/conftest.py with ``pytest_plugins = ["tests.realkube.fixtures"]``.

The binaries must already be built (``python3 scripts/build_kube.py``): a cold
build takes far longer than pytest's per-test timeout, so the fixture never
builds. Without them, or without Go, tests that use the fixtures are skipped
with a one-line reason, except in CI (CI=true), where that is a failure: CI
must build them before it runs the suite.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from tests.realkube.controlplane import ControlPlane, ControlPlaneError, build_kube

BUILD_HINT = "run python3 scripts/build_kube.py first (a cold build takes tens of minutes)"


def unavailable(reason: str) -> NoReturn:
    """Skip, or in CI fail: there the real control plane is required."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"real Kubernetes control plane unavailable in CI: {reason}", pytrace=False)
    pytest.skip(f"real Kubernetes control plane unavailable: {reason}")


def built_binaries() -> dict[str, Path]:
    """The cached binaries, or a skip (a failure in CI) saying why there are none."""
    module = build_kube()
    try:
        found: dict[str, Path] | None = module.cached_binaries()
    except module.BuildError as err:
        unavailable(str(err))
    if found is None:
        unavailable(f"the binaries are not built: {BUILD_HINT}")
    return found


@pytest.fixture(scope="session")
def realkube_binaries() -> dict[str, Path]:
    """Paths of kube-apiserver, kube-controller-manager, kube-scheduler, etcd, kwok."""
    return built_binaries()


@pytest.fixture(scope="session")
def realkube(
    realkube_binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver on loopback, started once for the whole run."""
    plane = ControlPlane(tmp_path_factory.mktemp("realkube"), binaries=realkube_binaries)
    try:
        plane.start()
    except ControlPlaneError as err:
        pytest.fail(f"real control plane did not start: {err}", pytrace=False)
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def realkube_namespace(realkube: ControlPlane) -> Iterator[str]:
    """A namespace of the test's own (deleted afterwards; without
    kube-controller-manager it stays Terminating, which harms no other test)."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    realkube.create_namespace(name)
    yield name
    realkube.delete_namespace(name)
