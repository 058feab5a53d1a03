"""Failover between two real ``capwatch controller`` processes on one shard.

Lease timings are scaled down (lease 1.5 s, renew deadline 1 s, retry 0.2 s, so a
standby polls every 0.2-0.44 s). After every test the fake API server's write log
is checked: no Node status write ever came from a replica that did not hold the
Lease, or from one whose last successful renewal (server time) was older than the
renew deadline.

Takeover bound, from the instant the leader stops renewing (killed, cut off):
the standby observes the last renewal within one jittered retry (0.44 s), waits
the record's leaseDurationSeconds (2 s: 1.5 rounded up) from then, and tries
again within another retry: 2.88 s, plus :data:`MARGIN_S` for a loaded 2-core
machine (request latency, process scheduling).
"""

from __future__ import annotations

import math
import signal
import time

import pytest

from tests.controller.e2e.processes import Process, wait_until
from tests.controller.e2e.support import (
    LEASE,
    LEASE_S,
    NAMESPACE,
    RENEW_S,
    RETRY_S,
    Cluster,
    fencing_violations,
    free_port,
    history,
    sample,
    scrape,
    user_agent,
)

pytestmark = pytest.mark.slow

JITTERED_RETRY_S = RETRY_S * 2.2  # client-go's jitter factor 1.2
RECORDED_LEASE_S = math.ceil(LEASE_S)
TAKEOVER_BOUND_S = JITTERED_RETRY_S + RECORDED_LEASE_S + JITTERED_RETRY_S
MARGIN_S = 2.0


def _pair(cluster: Cluster) -> tuple[Process, Process, dict[str, int]]:
    """gpu-a's agent serving; two controllers started together: (leader, standby, their
    metrics ports by identity), the standby following gpu-a's stream (hot)."""
    cluster.gpu_node("gpu-a")
    cluster.agent("gpu-a", 1)
    cluster.pod("gpu-a", 1)
    cluster.wait_cycled("gpu-a")
    ports = {"ctl-a": free_port(), "ctl-b": free_port()}
    started = {name: cluster.controller(name, metrics_port=port) for name, port in ports.items()}
    leader = wait_until(cluster.holder, timeout=30, what="a controller to take the Lease")
    standby = "ctl-b" if leader == "ctl-a" else "ctl-a"
    cluster.wait_condition("gpu-a", "True", "CapsEnforced")
    wait_until(
        lambda: (
            sample(scrape(ports[standby]), "capwatch_controller_streams", state="connected") == 1
        ),
        timeout=30,
        what=f"{standby} following gpu-a",
    )
    return started[leader], started[standby], ports


def _identity(process: Process) -> str:
    return process.name.removeprefix("controller-")


def _last_renewal(cluster: Cluster, identity: str, *, before: float) -> float:
    return max(
        w.at
        for w in cluster.fake.lease_writes(NAMESPACE, LEASE)
        if w.holder == identity and w.at <= before
    )


def test_a_killed_leader_is_replaced_within_the_lease(cluster: Cluster) -> None:
    """SIGKILL of the leader: the standby takes the Lease once the record's
    leaseDurationSeconds (the 1.5 s asked for, rounded up, never down) has passed since
    the leader's last renewal, and within the takeover bound of the kill; it then writes
    what changed meanwhile (gpu-a's agent, killed just after the leader, reads
    AgentUnreachable, written by the new leader). The Lease counts one transition."""
    leader, standby, _ = _pair(cluster)
    lease = cluster.fake.lease(NAMESPACE, LEASE)
    assert lease is not None
    recorded = lease["spec"]["leaseDurationSeconds"]
    assert recorded >= LEASE_S, f"the Lease says {recorded}s, shorter than the {LEASE_S}s asked"

    killed = leader.signal(signal.SIGKILL)
    cluster.agents["gpu-a"].popen.kill()
    cluster.wait_leader(_identity(standby), timeout=TAKEOVER_BOUND_S + MARGIN_S + 5)
    taken = cluster.acquired_at(_identity(standby), after=killed)
    last = _last_renewal(cluster, _identity(leader), before=killed)
    print(f"killed leader: taken over {taken - killed:.2f}s after the kill")
    assert taken - last >= recorded, "the standby took over before the lease ran out"
    assert taken - killed <= TAKEOVER_BOUND_S + MARGIN_S

    cluster.wait_condition("gpu-a", "Unknown", "AgentUnreachable")
    assert cluster.write_log("gpu-a")[-1] == (
        user_agent(_identity(standby)),
        ("Unknown", "AgentUnreachable"),
    )
    lease = cluster.fake.lease(NAMESPACE, LEASE)
    assert lease is not None
    assert lease["spec"]["leaseTransitions"] == 1
    assert fencing_violations(cluster.fake) == []


@pytest.mark.parametrize("mode", ["partition", "refused"])
def test_a_leader_cut_off_from_the_api_server_is_replaced_and_stays_fenced(
    cluster: Cluster, mode: str
) -> None:
    """The leader cut off from the API server (a partition: its requests hang and never
    land; or refused: each one answered 503) stops leading at its renew deadline, the
    standby takes over within the takeover bound and writes what changed meanwhile; once
    the old leader reaches the API server again it stays a follower and writes nothing,
    though it saw the same changes (and one more after the restore)."""
    leader, standby, ports = _pair(cluster)
    old, new = _identity(leader), _identity(standby)
    cut = time.monotonic()
    if mode == "partition":
        cluster.fake.cut_off(user_agent(old), hang_s=60)
    else:
        cluster.fake.cut_off(user_agent(old), status=503)
    cluster.agents["gpu-a"].popen.kill()

    cluster.wait_leader(new, timeout=TAKEOVER_BOUND_S + MARGIN_S + 5)
    taken = cluster.acquired_at(new, after=cut)
    print(f"{mode}: taken over {taken - cut:.2f}s after the cut-off")
    assert taken - cut <= TAKEOVER_BOUND_S + MARGIN_S
    leader.wait_log(rf"lost lease={LEASE}: no renewal within 1s", timeout=10)
    cluster.wait_condition("gpu-a", "Unknown", "AgentUnreachable")

    cluster.fake.restore()
    restored = time.monotonic()
    wait_until(
        lambda: any(
            r.at > restored and not r.cut_off
            for r in cluster.fake.requests("lease")
            if r.user_agent == user_agent(old)
        ),
        what=f"{old} to read the Lease again",
    )
    cluster.fake.delete_pod(NAMESPACE, "capwatch-agent-gpu-a")
    cluster.wait_condition("gpu-a", "Unknown", "AgentMissing")

    def old_leader_follows() -> bool:
        found = scrape(ports[old])
        return (
            sample(found, "capwatch_controller_streams", state="missing") == 1
            and sample(found, "capwatch_controller_leader", shard="0") == 0
        )

    wait_until(old_leader_follows, what=f"{old} to see the pod go, as a follower")
    assert cluster.holder() == new
    assert [ua for ua, _ in cluster.write_log()] == [
        user_agent(old),
        user_agent(new),
        user_agent(new),
    ], cluster.write_log()
    assert all(w.at < cut for w in cluster.fake.node_status_writes() if old in w.user_agent)
    assert fencing_violations(cluster.fake) == []


def test_a_leader_that_cannot_renew_stops_writing_though_writes_still_work(
    cluster: Cluster,
) -> None:
    """Every Lease update refused (503) while the API server still takes Node writes:
    the leader stops writing at its renew deadline, so a change after that (gpu-a's
    agent killed) is written by nobody while no replica holds a fresh Lease; once Lease
    updates work again a replica takes the Lease and writes it."""
    leader, _, _ = _pair(cluster)
    cluster.fake.fail_next("lease", 503, count=100_000, method="PUT")
    last = _last_renewal(cluster, _identity(leader), before=time.monotonic())
    # Past the renew deadline of the last renewal that landed (server time), whatever
    # the leader itself believes: from here on it must not write.
    wait_until(lambda: time.monotonic() > last + RENEW_S + 0.3, what="the renew deadline")
    cluster.agents["gpu-a"].popen.kill()
    # Both replicas have now tried to take the Lease (the standby once it expired).
    wait_until(
        lambda: (
            {r.user_agent for r in cluster.fake.requests("lease") if r.method == "PUT"}
            >= {user_agent("ctl-a"), user_agent("ctl-b")}
        ),
        timeout=TAKEOVER_BOUND_S + MARGIN_S + 5,
        what="both replicas to try to update the Lease",
    )
    assert cluster.writes("gpu-a") == [("True", "CapsEnforced")], history(cluster.fake)
    assert f"lost lease={LEASE}: no renewal within 1s" in leader.log

    cluster.fake.clear_faults()
    cluster.wait_condition("gpu-a", "Unknown", "AgentUnreachable")
    assert fencing_violations(cluster.fake) == []


def test_sigterm_finishes_the_write_in_flight_then_releases_the_lease(cluster: Cluster) -> None:
    """SIGTERM while a condition write is in flight (the API server holds it 0.6 s): the
    leader lets it land, only then clears the Lease's holder, and exits 0; the standby
    takes over at its next retry, well before a lease duration, and the write log shows
    no write after the release from the old leader."""
    leader, standby, _ = _pair(cluster)
    old, new = _identity(leader), _identity(standby)
    cluster.fake.hang_next("node_status", 0.6)
    before = cluster.fake.count("node_status")
    cluster.agents["gpu-a"].popen.kill()
    wait_until(lambda: cluster.fake.count("node_status") > before, what="the write to arrive")
    leader.signal(signal.SIGTERM)
    assert leader.wait(timeout=20) == 0, leader.log[-2000:]

    releases = [
        w
        for w in cluster.fake.lease_writes(NAMESPACE, LEASE)
        if w.holder == "" and old in w.user_agent
    ]
    assert len(releases) == 1, leader.log[-2000:]
    released = releases[0].at
    writes = [w.at for w in cluster.fake.node_status_writes() if old in w.user_agent]
    assert cluster.writes("gpu-a") == [
        ("True", "CapsEnforced"),
        ("Unknown", "AgentUnreachable"),
    ], history(cluster.fake)
    assert max(writes) < released, "a write of the old leader landed after its release"

    cluster.wait_leader(new, timeout=10)
    taken = cluster.acquired_at(new, after=released)
    print(f"released: taken over {taken - released:.2f}s after the release")
    assert taken - released <= JITTERED_RETRY_S + MARGIN_S
    assert taken - released < RECORDED_LEASE_S
    assert fencing_violations(cluster.fake) == []
