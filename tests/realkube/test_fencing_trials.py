"""The fencing policy against a leader frozen in the middle of a burst of writes, and
under a leader's steady load, on an audited real API server (tests/realkube/trials.py).

bench/scenarios/fencing.py runs 20 trials with the policy and 20 without and prints the figures;
here a few trials must hold the guarantee: no write of the old leader admitted once
the standby has taken the Lease over, and no stale condition left behind."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chart.support import Helm
from tests.controller.e2e.processes import wait_until
from tests.realkube.audit import audited_plane
from tests.realkube.components import open_scene
from tests.realkube.controlplane import ControlPlane
from tests.realkube.trials import audited, started_pair

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

FENCING = ("--set", "controller.fencing.admissionPolicy=true")


@pytest.fixture(scope="module")
def plane(
    realkube_binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """A control plane of this module's own, auditing every request."""
    with audited_plane(tmp_path_factory.mktemp("trials"), realkube_binaries) as started:
        yield started


def test_a_frozen_leader_gets_no_write_in_after_the_takeover(
    plane: ControlPlane, helm: Helm, tmp_path: Path
) -> None:
    """Three trials: each time the leader is frozen by its first write of a burst of 60,
    the standby takes over, the old leader is thawed; of what it then sends, the API
    server admits nothing (refusals counted), and every node ends with the new leader's
    condition."""
    namespace = f"trials-{uuid.uuid4().hex[:8]}"
    plane.create_namespace(namespace)
    audit = plane.directory / "audit.log"
    with open_scene(
        plane, namespace, helm, tmp_path, components=("controller",), values=FENCING
    ) as scene:
        scene.install_fencing()
        with started_pair(scene, audit, nodes=60, heartbeat_s=300) as pair:
            trials = [pair.trial(fenced=True, settle_s=2.0) for _ in range(3)]
    assert [t.admitted_after for t in trials] == [0, 0, 0], trials
    assert [t.stale for t in trials] == [0, 0, 0], trials


def test_the_policy_admits_the_holders_writes_under_load(
    plane: ControlPlane, helm: Helm, tmp_path: Path
) -> None:
    """A leader that holds its Lease throughout, rewriting 250 nodes' conditions every
    second (the heartbeat at 1 s): of 5,000 and more writes, the policy refuses none."""
    namespace = f"load-{uuid.uuid4().hex[:8]}"
    plane.create_namespace(namespace)
    audit = plane.directory / "audit.log"
    user_writes = 0
    with open_scene(
        plane, namespace, helm, tmp_path, components=("controller",), values=FENCING
    ) as scene:
        scene.install_fencing()
        mark = audit.stat().st_size
        user = scene.release.user("controller")
        with started_pair(scene, audit, nodes=250, heartbeat_s=1.0) as pair:

            def writes() -> list[int]:
                return [c.code for c in audited(audit, mark, user) if c.write]

            wait_until(lambda: len(writes()) >= 5_000, timeout=240, what="5,000 writes")
            leader = pair.leader()
            codes = writes()
            user_writes = len(codes)
            assert pair.leader() == leader  # one term throughout
    assert user_writes >= 5_000
    assert [code for code in codes if code == 403] == []
    assert set(codes) <= {200, 201}
