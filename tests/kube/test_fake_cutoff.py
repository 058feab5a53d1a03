"""Per-client fault injection in the fake API server: one client, named by a User-Agent
substring, cut off (an error status, or a partition that hangs and drops its requests)
while every other client still reaches the server. Fault injection: the real server
cannot do this on demand, so these tests are the fake's alone."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest
import urllib3.exceptions

from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.kube.conftest import ClientFactory
from tests.kube.rawapi import SMP, Watch, call
from tests.kube.support import wait_until

LEASES = "/apis/coordination.k8s.io/v1/namespaces/capwatch/leases"
LEADER, STANDBY = "capwatch-controller/a", "capwatch-controller/b"
DROPPED = (urllib3.exceptions.HTTPError, OSError)  # the connection ends with no answer


def _lease_body(holder: str, rv: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "shard-0", "resourceVersion": rv},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 15,
            "renewTime": "2025-03-01T10:00:02.000000Z",
        },
    }


def test_a_cut_off_client_gets_its_status_and_the_others_do_not(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """Every request from the cut-off client answers the chosen status (503 with
    Retry-After here) and writes nothing, logged as cut off; the standby's requests are
    served; a fault queued for everyone is not used up by the cut-off client; after
    restore the client is served again."""
    kube_apiserver.add_node("n1")
    kube_apiserver.add_lease("capwatch", "shard-0", holder="a")
    leader, standby = make_client(LEADER), make_client(STANDBY)
    kube_apiserver.cut_off("controller/a", status=503, retry_after=2)
    kube_apiserver.fail_next("lease", 500)

    refused = call(leader, "GET", f"{LEASES}/shard-0")
    assert (refused.status, refused.reason, refused.headers["Retry-After"]) == (
        503,
        "ServiceUnavailable",
        "2",
    )
    patch = {"status": {"conditions": [{"type": "GPUPowerCapEnforced", "status": "True"}]}}
    written = call(leader, "PATCH", "/api/v1/nodes/n1/status", body=patch, content_type=SMP)
    assert written.status == 503
    assert call(leader, "GET", "/api/v1/nodes").status == 503
    assert kube_apiserver.node_status_writes() == []

    assert call(standby, "GET", f"{LEASES}/shard-0").status == 500  # the queued fault
    assert call(standby, "GET", f"{LEASES}/shard-0").status == 200
    assert [(r.user_agent, r.cut_off) for r in kube_apiserver.requests()] == [
        (LEADER, True),
        (LEADER, True),
        (LEADER, True),
        (STANDBY, False),
        (STANDBY, False),
    ]

    kube_apiserver.restore("controller/a")
    assert call(leader, "GET", f"{LEASES}/shard-0").status == 200


def test_a_partitioned_client_hangs_and_its_requests_never_land(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """In hang mode the cut-off client's request gets no answer and is dropped unserved,
    after ``hang_s`` or at restore, whichever is first: its lease renewal never lands,
    while the standby takes the Lease over meanwhile."""
    created = kube_apiserver.add_lease("capwatch", "shard-0", holder="a")
    rv = created["metadata"]["resourceVersion"]
    leader, standby = make_client(LEADER), make_client(STANDBY)

    kube_apiserver.cut_off(LEADER, hang_s=0.2)
    with pytest.raises(DROPPED):
        call(leader, "PUT", f"{LEASES}/shard-0", body=_lease_body("a", rv))

    kube_apiserver.cut_off(LEADER, hang_s=60)  # replaces the cut-off above
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        renewal = pool.submit(
            call, leader, "PUT", f"{LEASES}/shard-0", body=_lease_body("a", rv), timeout=30
        )
        wait_until(lambda: kube_apiserver.count("lease") == 2, what="the renewal to arrive")
        takeover = call(standby, "PUT", f"{LEASES}/shard-0", body=_lease_body("b", rv))
        assert takeover.status == 200
        assert not renewal.done()
        kube_apiserver.restore()
        with pytest.raises(DROPPED):
            renewal.result(timeout=10)

    lease = kube_apiserver.lease("capwatch", "shard-0")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "b"
    assert [(w.user_agent, w.holder) for w in kube_apiserver.lease_writes()] == [
        ("test", "a"),
        (STANDBY, "b"),
    ]
    assert [r.cut_off for r in kube_apiserver.requests("lease")] == [True, True, False]


def test_a_cut_off_clients_open_watches_are_cut_or_silenced(
    kube_apiserver: FakeKubeApiServer, make_client: ClientFactory
) -> None:
    """Status mode cuts the client's open watches (no terminating chunk); hang mode
    silences them (no event reaches it while the standby's watch gets it) and they
    carry on after restore with what they missed."""
    kube_apiserver.add_node("n1")
    leader, standby = make_client(LEADER), make_client(STANDBY)
    query = {"resourceVersion": str(kube_apiserver.resource_version), "timeoutSeconds": "30"}

    cut = Watch(leader, "/api/v1/nodes", query)
    kept = Watch(standby, "/api/v1/nodes", query)
    probe = resumed = None
    try:
        wait_until(lambda: kube_apiserver.open_watch_count("node_watch") == 2, what="watches")
        kube_apiserver.cut_off(LEADER, status=503)
        with pytest.raises(DROPPED):
            cut.next()
        kube_apiserver.update_node_labels("n1", {"a": "1"})
        assert kept.take(1) == [("MODIFIED", "n1")]
        kube_apiserver.restore()

        query["resourceVersion"] = str(kube_apiserver.resource_version)
        probe = Watch(leader, "/api/v1/nodes", query, read_timeout=0.5)
        resumed = Watch(leader, "/api/v1/nodes", query)
        wait_until(lambda: kube_apiserver.open_watch_count("node_watch") == 3, what="watches")
        kube_apiserver.cut_off(LEADER, hang_s=60)
        kube_apiserver.update_node_labels("n1", {"a": "2"})
        assert kept.take(1) == [("MODIFIED", "n1")]
        with pytest.raises(urllib3.exceptions.ReadTimeoutError):
            probe.next()  # nothing reached the partitioned client
        kube_apiserver.restore(LEADER)
        event = resumed.next()
        assert (event["type"], event["object"]["metadata"]["labels"]) == ("MODIFIED", {"a": "2"})
    finally:
        for watch in (cut, kept, probe, resumed):
            if watch is not None:
                watch.close()
