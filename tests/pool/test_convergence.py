"""A controller following a 100-node pool, both real processes: every node's condition
converges to the truth, through a fault window, the pool's death and its restart."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from capwatch.agent.sim.poolspec import node_names, parse_fault
from tests.pool.processes import (
    ClusterClient,
    Conditions,
    controller_argv,
    pool_argv,
    process,
    serving_address,
    wait_for,
)

NODES = 100
INTERVAL = 0.5  # stale after 1.5 s
# The window opens once the controller surely follows every node, and lasts long enough
# for every hit node to cycle in it several times.
FAULT = "write_failed:0.2@6+8"
TRUE = ("True", "CapsEnforced")
FAILED = ("False", "CapWriteFailed")
UNREACHABLE = ("Unknown", "AgentUnreachable")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_controller_converges_on_every_node_of_a_pool_and_after_its_restart(tmp_path: Path):
    """capwatch pool --nodes 100 --interval 0.5 --fault write_failed:0.2@6+8 and capwatch
    controller --dry-run on its targets file: the cluster stream (GetClusterSnapshot) shows
    every hit node False CapWriteFailed and every other node True during the window, and
    all True after it; the dry run printed False only for hit nodes. SIGKILL the pool:
    every node goes Unknown AgentUnreachable (no True left behind); restart it on the same
    port: every node is True again, from the new agent instances."""
    names = node_names(NODES, prefix="sim-node-")
    hit = {name for name in names if parse_fault("--fault", FAULT).hits(name)}
    assert 5 <= len(hit) <= 40, len(hit)
    expected: Conditions = {name: FAILED if name in hit else TRUE for name in names}
    everywhere = dict.fromkeys(names, TRUE)
    targets = tmp_path / "targets.txt"
    figures: dict[str, float] = {}

    with process(
        pool_argv(
            nodes=NODES, interval=INTERVAL, listen="127.0.0.1:0", targets=targets, faults=(FAULT,)
        ),
        tmp_path / "pool",
    ) as pool:
        started = time.monotonic()
        wait_for("the targets file", targets.exists, 20)
        listen = targets.read_text().split()[1]
        with process(controller_argv(targets), tmp_path / "controller") as controller:
            err = tmp_path / "controller.err"
            wait_for("the cluster stream", lambda: serving_address(err) is not None, 20)
            address = serving_address(err)
            assert address is not None
            cluster = ClusterClient(address)
            try:
                seen: list[Conditions] = []

                def now_is(wanted: Conditions) -> bool:
                    assert controller.poll() is None, err.read_text()
                    seen.append(cluster.conditions())
                    return seen[-1] == wanted

                wait_for("hit nodes False, the others True", lambda: now_is(expected), 30)
                figures["window"] = time.monotonic() - started
                wait_for("every node True after the window", lambda: now_is(everywhere), 20)
                figures["after"] = time.monotonic() - started
                # Never a wrong False on the way: only hit nodes ever failed.
                failed = {n for c in seen for n, (status, _) in c.items() if status == "False"}
                assert failed == hit
                before = {n.node_name: n.agent_instance_id for n in cluster.snapshot().nodes}

                pool.kill()
                pool.wait(timeout=10)
                killed = time.monotonic()
                unreachable = dict.fromkeys(names, UNREACHABLE)
                wait_for("every node Unknown", lambda: now_is(unreachable), 20)
                figures["unknown"] = time.monotonic() - killed
                time.sleep(1.0)  # and it stays so: no stale True comes back
                assert cluster.conditions() == unreachable

                restart = pool_argv(nodes=NODES, interval=INTERVAL, listen=listen, targets=targets)
                with process(restart, tmp_path / "pool-again"):
                    restarted = time.monotonic()
                    wait_for("every node True again", lambda: now_is(everywhere), 40)
                    figures["again"] = time.monotonic() - restarted
                    after = {n.node_name: n.agent_instance_id for n in cluster.snapshot().nodes}
                    assert all(after[name] and after[name] != before[name] for name in names)
            finally:
                cluster.close()
        patches = (tmp_path / "controller.out").read_text().splitlines()
    false_patches = {line.split("/")[1] for line in patches if "Enforced=False" in line}
    assert false_patches == hit
    print(f"convergence figures (s): {figures}")
