"""The uninstall cleanup at 5,000 KWOK nodes (docs/upgrades.md, "Uninstall"): the chart's
post-delete Job command, with its own RBAC and the chart's deadlines, against a real API
server whose nodes KWOK keeps Ready (their status written all the while)."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.chart.support import Helm
from tests.realkube.components import CONDITION, open_scene
from tests.realkube.controlplane import ControlPlane
from tests.realkube.kwok_cluster import KwokNodes, kwok_plane
from tests.realkube.local import flag

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

NODES = 5000
SMP = "application/strategic-merge-patch+json"


@pytest.fixture(scope="module")
def plane(
    realkube_binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    with kwok_plane(tmp_path_factory.mktemp("cleanup-scale"), realkube_binaries) as started:
        yield started


def _ours(node: dict[str, Any]) -> bool:
    return any(c["type"] == CONDITION for c in node.get("status", {}).get("conditions") or [])


def _listed(plane: ControlPlane) -> list[dict[str, Any]]:
    # A quorum read, not the watch cache's (resourceVersion=0): on a loaded machine the
    # cache can lag the writes just made, and this must see every one of them.
    path = "/api/v1/nodes?labelSelector=type%3Dkwok"
    items: list[dict[str, Any]] = json.loads(plane.request_text("GET", path, timeout=60))["items"]
    return items


def test_the_cleanup_clears_5000_kwok_nodes_within_its_deadline(
    plane: ControlPlane, helm: Helm, tmp_path: Path
) -> None:
    """Every one of 5,000 Ready KWOK nodes carries the condition; one run of the cleanup
    removes it from all of them, exits 0 inside the chart's deadline, and leaves KWOK's
    own conditions (Ready) in place."""
    nodes = KwokNodes.create(plane, f"clean-{uuid.uuid4().hex[:6]}-", NODES, workers=16)
    try:
        nodes.wait_ready(timeout=300)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {
            "status": {
                "conditions": [
                    {
                        "type": CONDITION,
                        "status": "True",
                        "reason": "CapsEnforced",
                        "message": "power caps enforced",
                        "lastTransitionTime": stamp,
                        "lastHeartbeatTime": stamp,
                    }
                ]
            }
        }

        def mark(name: str) -> None:
            path = f"/api/v1/nodes/{name}/status"
            plane.request_text("PATCH", path, body, content_type=SMP, timeout=60)

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(mark, nodes.names))
        assert sum(1 for n in _listed(plane) if _ours(n)) == NODES

        namespace = f"cleanup-{uuid.uuid4().hex[:8]}"
        plane.create_namespace(namespace)
        with open_scene(plane, namespace, helm, tmp_path, components=("cleanup",)) as scene:
            args = scene.release.container("Job", "cleanup")["args"]
            deadline_s = float(flag(args, "--cleanup-timeout"))
            started = time.monotonic()
            done = scene.cleanup(timeout=deadline_s + 60)
            took = time.monotonic() - started
        print(f"cleanup of {NODES} KWOK nodes: {took:.1f}s (deadline {deadline_s:g}s)")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        removed = re.search(rf"removed {CONDITION} from (\d+) of (\d+) nodes", done.stdout)
        assert removed is not None, done.stdout
        assert int(removed.group(1)) == NODES
        assert took < deadline_s
        listed = _listed(plane)
        assert [n["metadata"]["name"] for n in listed if _ours(n)] == []
        # KWOK's own conditions stay (whatever their status: a loaded machine can make
        # the node lifecycle controller doubt KWOK's heartbeats meanwhile).
        kept = sum(1 for n in listed for c in n["status"]["conditions"] if c["type"] == "Ready")
        assert kept == NODES
    finally:
        nodes.delete()
