"""A real controller against an API server that fails: refused and throttled writes,
failing, expiring and dropped watches, a Lease taken behind the leader's back.

Times are the fake API server's (request arrival, ``time.monotonic()``): a retry's
lower bound is certain (it cannot arrive before its delay has passed since the
failure it answers), so only lower bounds are asserted.
"""

from __future__ import annotations

import pytest

from tests.controller.e2e.support import (
    Cluster,
    history,
)

pytestmark = pytest.mark.slow


def test_a_slow_write_is_not_sent_again_while_it_is_in_flight(cluster: Cluster) -> None:
    """The API server takes 2 s over the first condition PATCH (under a lease whose renew
    deadline allows it) while gpu-a's agent reports a cycle every 0.5 s: the node is
    written once, not once more per cycle by the writer's other workers in parallel."""
    cluster.gpu_node("gpu-a")
    cluster.agent("gpu-a", 1)
    cluster.pod("gpu-a", 1)
    cluster.agents["gpu-a"].wait_log(r"grpc serving addresses=")
    cluster.fake.hang_next("node_status", 2.0)
    slow_lease = ("--lease-duration", "15", "--renew-deadline", "10", "--retry-period", "2")
    controller = cluster.controller("c1", *slow_lease)
    cluster.wait_condition("gpu-a", "True", "CapsEnforced")
    cluster.agents["gpu-a"].popen.kill()  # a change after the slow write: written once
    cluster.wait_condition("gpu-a", "Unknown", "AgentUnreachable")

    assert cluster.fake.count("node_status") == 2, history(cluster.fake)
    assert cluster.writes("gpu-a") == [("True", "CapsEnforced"), ("Unknown", "AgentUnreachable")]
    assert controller.popen.poll() is None
