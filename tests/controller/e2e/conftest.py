"""Fixtures: one test's cluster (a fake API server, its kubeconfig, the processes it starts)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.controller.e2e.support import Cluster, Processes
from tests.fakes.kube_apiserver import FakeKubeApiServer


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A running fake API server and the test's subprocesses, all stopped after it."""
    fake = FakeKubeApiServer()
    fake.start()
    processes = Processes(tmp_path)
    try:
        yield Cluster(fake=fake, directory=tmp_path, processes=processes)
    finally:
        processes.close()
        fake.stop()
