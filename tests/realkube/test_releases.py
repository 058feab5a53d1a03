"""Two releases of the chart in one namespace (charts/capwatch/README.md, "Two releases"):
each owns its Leases, fencing parameters, Events' component and cleanup, and neither
touches the other's nodes, as long as no node is selected by both."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from tests.chart.support import Helm
from tests.controller.e2e.processes import wait_until
from tests.realkube.components import Scene, open_scene, unique
from tests.realkube.controlplane import ControlPlane

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

FENCING = ("--set", "controller.fencing.admissionPolicy=true")
# Each release's own GPU nodes: no node is selected by both.
POOLS = {"a": "example.com/capwatch-pool=a", "b": "example.com/capwatch-pool=b"}


def _nodes(scene: Scene, prefix: str) -> tuple[str, str]:
    """A node whose agent the pool serves (True) and a node with no agent (AgentMissing,
    so an Event is posted on it)."""
    served, bare = f"{prefix}0", unique("bare") + "x"
    scene.gpu_node(served)
    scene.agent_pod(served, scene.loopback.ip(1))
    scene.pool(prefix, 1)
    scene.wait_cycled([served])
    scene.gpu_node(bare)
    return served, bare


def test_two_releases_in_one_namespace_keep_to_their_own(
    realkube: ControlPlane, realkube_namespace: str, helm: Helm, tmp_path: Path
) -> None:
    """Both leaders hold Leases of their own release and write their own nodes (the fencing
    policies of both admit them), their Events name their release's component; the
    cleanup of one release takes its condition off every node, and the other release's
    leader, seeing its nodes' condition vanish, writes it back."""
    for key in POOLS:
        (tmp_path / key).mkdir()
    with contextlib.ExitStack() as stack:
        scenes = {
            key: stack.enter_context(
                open_scene(
                    realkube,
                    realkube_namespace,
                    helm,
                    tmp_path / key,
                    components=("controller", "cleanup"),
                    values=(*FENCING, "--set", f"controller.gpuNodeSelector={selector}"),
                )
            )
            for key, selector in POOLS.items()
        }
        nodes = {}
        for key, scene in scenes.items():
            scene.install_fencing()
            nodes[key] = _nodes(scene, unique(f"rel{key}"))
            scene.controller(0)
        for key, scene in scenes.items():
            served, bare = nodes[key]
            scene.wait_condition(served, "True", "CapsEnforced")
            scene.wait_condition(bare, "Unknown", "AgentMissing")
            assert scene.lease_name() == f"{scene.release.name}-controller-0-of-1"
            assert scene.holder().startswith(f"{scene.release.name}-controller-0_")
            component = f"{scene.release.name}-controller"
            wait_until(
                lambda scene=scene, bare=bare: scene.node_events(bare), what=f"an Event on {bare}"
            )
            assert {e["source"]["component"] for e in scene.node_events(bare)} == {component}
        a, b = scenes["a"], scenes["b"]
        assert a.lease_name() != b.lease_name()
        # Release a is uninstalled: its controller stops, then its post-delete hook runs.
        a.processes.close()
        done = a.cleanup()
        assert done.returncode == 0, done.stdout + done.stderr
        for node in nodes["a"]:
            assert a.condition(node) is None
        for node in nodes["b"]:
            wait_until(lambda node=node: b.condition(node) is not None, what=f"{node} rewritten")
        b.wait_condition(nodes["b"][0], "True", "CapsEnforced")
