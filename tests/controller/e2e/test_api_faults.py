"""A real controller against an API server that fails: refused and throttled writes,
failing, expiring and dropped watches, a Lease taken behind the leader's back.

Times are the fake API server's (request arrival, ``time.monotonic()``): a retry's
lower bound is certain (it cannot arrive before its delay has passed since the
failure it answers), so only lower bounds are asserted.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from capwatch.kube.transport import ApiTransport
from tests.controller.e2e.processes import Process, wait_until
from tests.controller.e2e.support import (
    LEASE,
    NAMESPACE,
    Cluster,
    fencing_violations,
    free_port,
    history,
    sample,
    scrape,
)
from tests.fakes.kube_apiserver import RequestKind
from tests.kube.rawapi import call, client_for

pytestmark = pytest.mark.slow


def _running(cluster: Cluster, metrics_port: int = 0) -> Process:
    """gpu-a's agent serving, with its pod; controller c1 leading and gpu-a True."""
    cluster.gpu_node("gpu-a")
    cluster.agent("gpu-a", 1)
    cluster.pod("gpu-a", 1)
    cluster.wait_cycled("gpu-a")
    controller = cluster.controller("c1", metrics_port=metrics_port)
    cluster.wait_leader("c1")
    cluster.wait_condition("gpu-a", "True", "CapsEnforced")
    return controller


def _arrivals(cluster: Cluster, kind: RequestKind, *, after: int = 0) -> list[float]:
    return [r.at for r in cluster.fake.requests(kind)][after:]


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


def test_refused_condition_writes_are_retried_with_backoff(cluster: Cluster) -> None:
    """A condition PATCH answered 429 with Retry-After: 2 is retried no sooner than 2 s
    later (counted throttled); one answered 500 three times is retried until it lands
    (the backoff's delays are pinned on virtual time, tests/controller/test_writing.py);
    both land, each with one Event, and the metrics count the failed attempts. The
    controller never stops."""
    port = free_port()
    controller = _running(cluster, metrics_port=port)
    before = cluster.fake.count("node_status")

    cluster.fake.fail_next("node_status", 429, retry_after=2)
    cluster.agents["gpu-a"].popen.kill()
    cluster.wait_condition("gpu-a", "Unknown", "AgentUnreachable")
    throttled = _arrivals(cluster, "node_status", after=before)
    assert len(throttled) == 2
    assert _gaps(throttled)[0] >= 2.0, "Retry-After was not honoured"

    cluster.fake.fail_next("node_status", 500, count=3)
    cluster.fake.delete_pod(NAMESPACE, "capwatch-agent-gpu-a")
    cluster.wait_condition("gpu-a", "Unknown", "AgentMissing")
    failing = _arrivals(cluster, "node_status", after=before + 2)
    assert len(failing) == 4

    assert cluster.writes("gpu-a") == [
        ("True", "CapsEnforced"),
        ("Unknown", "AgentUnreachable"),
        ("Unknown", "AgentMissing"),
    ]
    cluster.wait_events("gpu-a", [("Warning", "AgentUnreachable"), ("Warning", "AgentMissing")])
    found = wait_until(
        lambda: (
            (s := scrape(port))
            and sample(s, "capwatch_controller_condition_writes_total", result="ok") == 3
            and s
        ),
        what="the last write to be counted",
    )
    assert sample(found, "capwatch_controller_condition_writes_total", result="failed") == 3
    assert sample(found, "capwatch_controller_condition_writes_total", result="throttled") == 1
    assert controller.popen.poll() is None
    assert fencing_violations(cluster.fake) == []


def test_failing_expiring_and_dropped_watches_are_survived(cluster: Cluster) -> None:
    """The node and pod watches answered 429 (Retry-After: 2, honoured), 500, then 410
    (each informer relists, and the relists rewrite no Node: nothing changed), then
    dropped while a pod is deleted and history compacted (the watch comes back to a 410,
    the relist finds the pod gone: AgentMissing). The controller stays up, its streams
    unaffected, and every write is the leader's, fenced."""
    controller = _running(cluster)
    writes = len(cluster.fake.node_status_writes())
    node_watches = cluster.fake.count("node_watch")
    cluster.fake.fail_next("node_watch", 429, retry_after=2)
    cluster.fake.fail_next("watch", 500)
    cluster.fake.end_watches()
    wait_until(
        lambda: (
            cluster.fake.open_watch_count("node_watch") == 1
            and cluster.fake.count("node_watch") >= node_watches + 2
        ),
        what="the node watch to come back after its 429",
    )
    throttled = _arrivals(cluster, "node_watch", after=node_watches)
    assert _gaps(throttled)[0] >= 2.0, "Retry-After was not honoured on the node watch"
    wait_until(lambda: cluster.fake.open_watch_count("watch") == 1, what="the pod watch back")

    node_lists, pod_lists = cluster.fake.count("node_list"), cluster.fake.count("list")
    cluster.fake.fail_next("node_watch", 410)
    cluster.fake.fail_next("watch", 410, in_stream=True)
    cluster.fake.end_watches()
    wait_until(
        lambda: (
            cluster.fake.count("node_list") > node_lists
            and cluster.fake.count("list") > pod_lists
            and cluster.fake.open_watches == 2
        ),
        what="both informers to relist and watch again",
    )
    assert cluster.agents["gpu-a"].popen.poll() is None
    assert len(cluster.fake.node_status_writes()) == writes, history(cluster.fake)

    pod_lists = cluster.fake.count("list")
    with cluster.fake.atomic():
        cluster.fake.drop_watches()
        cluster.fake.delete_pod(NAMESPACE, "capwatch-agent-gpu-a")
        cluster.fake.compact()
    cluster.wait_condition("gpu-a", "Unknown", "AgentMissing")
    assert cluster.fake.count("list") > pod_lists, "the deletion was seen without a relist"
    assert "watch expired, relisting what='capwatch agent pods'" in controller.log
    assert cluster.writes("gpu-a") == [("True", "CapsEnforced"), ("Unknown", "AgentMissing")]
    assert controller.popen.poll() is None
    assert fencing_violations(cluster.fake) == []


@pytest.fixture
def rogue(cluster: Cluster) -> Iterator[ApiTransport]:
    """A client of the fake API server that is not a capwatch controller."""
    client = client_for(cluster.fake, user_agent="another-controller")
    yield client
    client.close()


def test_a_lease_taken_behind_the_leaders_back_ends_its_writing(
    cluster: Cluster, rogue: ApiTransport
) -> None:
    """Another replica writes itself into the Lease while the leader's renewal is in
    flight: the renewal, conditional on the resourceVersion it read, is refused 409; the
    leader reads the Lease, sees it held and valid, steps down at once (not at its renew
    deadline) and holds back the change that follows (gpu-a's agent killed), counting it
    fenced."""
    port = free_port()
    controller = _running(cluster, metrics_port=port)
    path = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEASE}"
    puts = len([r for r in cluster.fake.requests("lease") if r.method == "PUT"])
    cluster.fake.hang_next("lease", 0.25, method="PUT")
    wait_until(
        lambda: len([r for r in cluster.fake.requests("lease") if r.method == "PUT"]) > puts,
        what="the leader's renewal to arrive",
    )
    current = call(rogue, "GET", path)
    body = current.body
    body["spec"] = {**body["spec"], "holderIdentity": "ctl-x", "leaseDurationSeconds": 60}
    assert call(rogue, "PUT", path, body=body).status == 200

    controller.wait_log(rf"lease={LEASE} changed under this attempt \(409\)", timeout=10)
    controller.wait_log(rf"lease={LEASE} taken over by ctl-x", timeout=10)
    assert "no renewal within" not in controller.log
    assert sample(scrape(port), "capwatch_controller_leader", shard="0") == 0
    fenced = sample(scrape(port), "capwatch_controller_condition_writes_total", result="fenced")

    cluster.agents["gpu-a"].popen.kill()
    wait_until(
        lambda: (
            (
                sample(scrape(port), "capwatch_controller_condition_writes_total", result="fenced")
                or 0
            )
            > (fenced or 0)
        ),
        what="the change to be held back",
    )
    assert cluster.writes("gpu-a") == [("True", "CapsEnforced")]
    assert fencing_violations(cluster.fake) == []


def test_a_slow_write_is_not_sent_again_while_it_is_in_flight(cluster: Cluster) -> None:
    """The API server takes 2 s over the first condition PATCH (under a lease whose renew
    deadline allows it) while gpu-a's agent reports a cycle every 0.5 s: the node is
    written once, not once more per cycle by the writer's other workers in parallel."""
    cluster.gpu_node("gpu-a")
    cluster.agent("gpu-a", 1)
    cluster.pod("gpu-a", 1)
    cluster.wait_cycled("gpu-a")
    cluster.fake.hang_next("node_status", 2.0)
    slow_lease = ("--lease-duration", "15", "--renew-deadline", "10", "--retry-period", "2")
    controller = cluster.controller("c1", *slow_lease)
    cluster.wait_condition("gpu-a", "True", "CapsEnforced")
    cluster.agents["gpu-a"].popen.kill()  # a change after the slow write: written once
    cluster.wait_condition("gpu-a", "Unknown", "AgentUnreachable")

    assert cluster.fake.count("node_status") == 2, history(cluster.fake)
    assert cluster.writes("gpu-a") == [("True", "CapsEnforced"), ("Unknown", "AgentUnreachable")]
    assert controller.popen.poll() is None
