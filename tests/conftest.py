"""Fixtures shared across test packages: the fake NVML library (see tests/fakenvml/) and
the real Kubernetes control plane (see tests/realkube/)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

pytest_plugins = ["tests.fakenvml.fixtures", "tests.realkube.fixtures"]


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """A command run in-process configures logging (on a test's captured stderr): undo it,
    so no later test logs into a stream that is gone."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level
