"""Session fixtures: the chart rendered once per values variant (the real helm binary is
tests/conftest.py's ``helm``)."""

from __future__ import annotations

import pytest

from tests.chart.support import VARIANTS, Helm, Manifests


@pytest.fixture(scope="session")
def rendered(helm: Helm) -> dict[str, Manifests]:
    """Each values variant's manifests, rendered once for the whole session."""
    return {name: helm.render(*args) for name, args in VARIANTS.items()}


@pytest.fixture(scope="session")
def default(rendered: dict[str, Manifests]) -> Manifests:
    """The chart rendered with its default values."""
    return rendered["default"]


@pytest.fixture(scope="module")
def enabled(helm: Helm) -> Manifests:
    """The chart with the controller on and every other value at its default."""
    return helm.render("--set", "controller.enabled=true")


@pytest.fixture(scope="module")
def tls(rendered: dict[str, Manifests]) -> Manifests:
    """The ci/ variant: two shards of two replicas, agents on mutual TLS, monitoring on."""
    return rendered["controller-tls"]
