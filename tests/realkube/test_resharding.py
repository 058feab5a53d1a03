"""Resharding on ``helm upgrade`` (docs/upgrades.md, "Resharding"): one shard of two
replicas becomes two shards, rolled as the StatefulSet rolls it, on an audited real API
server with the chart's fencing policy.

Every node's condition is rewritten every :data:`HEARTBEAT_S` by its shard's leader, so
the audit log's admitted condition writes are each node's timeline: the longest pause
between two of a node's writes through the rollout is how long its writes stopped. The
bound is one Lease duration plus one cycle of its agent, plus the heartbeat period (a
leader writes a node at its next heartbeat) and a margin for a loaded 2-core machine.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from capwatch.controller.sharding import shard_of
from tests.chart.support import Helm
from tests.controller.e2e.processes import Process, wait_until
from tests.realkube.audit import audited_plane
from tests.realkube.components import LEASE_S, POOL_INTERVAL_S, Scene, open_scene
from tests.realkube.controlplane import ControlPlane
from tests.realkube.trials import audited

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NODES = 40
HEARTBEAT_S = 1.0
MARGIN_S = 2.0
BOUND_S = LEASE_S + POOL_INTERVAL_S + HEARTBEAT_S + MARGIN_S
READY_S = 3.0  # how long the StatefulSet waits between pods (a pod's start and readiness)
BEFORE = (
    *("--set", "controller.fencing.admissionPolicy=true"),
    *("--set", "controller.replicasPerShard=2"),
)


@pytest.fixture(scope="module")
def plane(
    realkube_binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """A control plane of this module's own, auditing every request."""
    with audited_plane(tmp_path_factory.mktemp("reshard"), realkube_binaries) as started:
        yield started


def pods(scene: Scene) -> str:
    """The StatefulSet's pods' names, but for their ordinals."""
    return f"{scene.release.manifests.one('StatefulSet')['metadata']['name']}-"


def _roll(scene: Scene, helm: Helm, old: dict[int, Process]) -> dict[int, Process]:
    """``helm upgrade --set controller.shards=2``, as the API server and the StatefulSet
    carry it out: the objects first, then (podManagementPolicy Parallel) the new ordinals
    2 and 3 at once, then the old pods one at a time, highest ordinal first, each replaced
    once the one before it is ready."""
    scene.upgrade(helm, *BEFORE, "--set", "controller.shards=2")
    new = {r: scene.controller(r, heartbeat_s=HEARTBEAT_S) for r in (2, 3)}
    for shard in (0, 1):
        wait_until(
            lambda shard=shard: scene.holder_of(shard) != "", timeout=60, what=f"shard {shard}"
        )
    for replica in (1, 0):
        time.sleep(READY_S)
        old[replica].popen.terminate()
        old[replica].wait(30)
        new[replica] = scene.controller(replica, heartbeat_s=HEARTBEAT_S)
    time.sleep(READY_S + BOUND_S)
    return new


def test_writes_resume_within_a_lease_and_a_cycle_through_a_reshard(
    plane: ControlPlane, helm: Helm, tmp_path: Path
) -> None:
    """From one shard to two: no node goes longer than the bound without an admitted
    condition write, and once the rollout is over each node is written only by the
    leader of its new shard."""
    namespace = f"reshard-{uuid.uuid4().hex[:8]}"
    plane.create_namespace(namespace)
    audit = plane.directory / "audit.log"
    prefix = f"reshard-{uuid.uuid4().hex[:6]}-"
    names = [f"{prefix}{i}" for i in range(NODES)]
    with open_scene(
        plane, namespace, helm, tmp_path, components=("controller",), values=BEFORE
    ) as scene:
        scene.install_fencing()
        for name in names:
            scene.gpu_node(name)
            scene.agent_pod(name, scene.loopback.ip(1))
        scene.pool(prefix, NODES)
        scene.wait_cycled(names)
        # Ordinal 1 leads the one shard: under two shards its ordinal is shard 1's, so
        # the new bindings judge it by a Lease it does not hold (the hard case).
        old = {1: scene.controller(1, heartbeat_s=HEARTBEAT_S)}
        wait_until(lambda: scene.holder_of(0).startswith(f"{pods(scene)}1_"), what="1 leads")
        old[0] = scene.controller(0, heartbeat_s=HEARTBEAT_S)
        for name in names:
            scene.wait_condition(name, "True", "CapsEnforced")
        user = scene.release.user("controller")
        mark = audit.stat().st_size
        started = datetime.now(UTC)
        _roll(scene, helm, old)
        ended = datetime.now(UTC)
        prefix = pods(scene)
    writes = [
        c
        for c in audited(audit, mark, user)
        if c.resource == "nodes" and c.subresource == "status" and c.admitted
    ]
    times: dict[str, list[datetime]] = defaultdict(list)
    for write in writes:
        times[write.name].append(write.received)
    gaps = {}
    for name in names:
        instants = [started, *sorted(times[name]), ended]
        gaps[name] = max((b - a).total_seconds() for a, b in itertools.pairwise(instants))
    worst = max(gaps, key=gaps.__getitem__)
    print(f"longest pause in a node's writes: {gaps[worst]:.2f}s ({worst}); bound {BOUND_S:g}s")
    assert gaps[worst] <= BOUND_S, sorted(gaps.values())[-5:]
    # The last READY_S + BOUND_S: every write by the leader of the node's new shard.
    late = ended.timestamp() - BOUND_S
    strays = [
        (w.name, w.pod)
        for w in writes
        if w.received.timestamp() > late
        and int(w.pod.removeprefix(prefix)) % 2 != shard_of(w.name, 2)
    ]
    assert strays == []
