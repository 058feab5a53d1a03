"""Session fixtures: the real helm binary, and the chart rendered once per values variant.

No helm is an error, not a skip: the chart checks are part of the suite, and a
machine that cannot fetch helm cannot vouch for the chart.
"""

from __future__ import annotations

import pytest

from tests.chart.support import VARIANTS, Helm, Manifests, fetch_helm


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """helm v4 from build/tools (fetched on first use), with private homes."""
    try:
        binary = fetch_helm()
    except (RuntimeError, OSError) as exc:
        pytest.fail(f"cannot fetch helm for the chart tests: {exc}")
    return Helm(binary=binary, home=tmp_path_factory.mktemp("helm-home"))


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
