"""Fixtures shared across test packages: the fake NVML library (see tests/fakenvml/) and
the real Kubernetes control plane (see tests/realkube/)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from tests.chart.support import Helm, fetch_helm

pytest_plugins = ["tests.fakenvml.fixtures", "tests.realkube.fixtures"]


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """A command run in-process configures logging (on a test's captured stderr): undo it,
    so no later test logs into a stream that is gone."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level


# No helm is an error, not a skip: the chart checks are part of the suite, and a
# machine that cannot fetch helm cannot vouch for the chart.
@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """helm v4 from build/tools (fetched on first use), with private homes."""
    try:
        binary = fetch_helm()
    except (RuntimeError, OSError) as exc:
        pytest.fail(f"cannot fetch helm for the chart tests: {exc}")
    return Helm(binary=binary, home=tmp_path_factory.mktemp("helm-home"))
