"""``resourceVersion`` and ``resourceVersionMatch`` on lists and watches, on the fake and
on a real kube-apiserver (``apiserver``; its watch cache on, as a cluster runs it).

What capwatch relies on: a list without a resourceVersion (every informer's) is a
consistent read that reflects every write acknowledged before it; its
resourceVersion is where the watch starts. The rest pins the other readings the
real server gives, so that the fake gives no others: ``0`` (any version, one page),
an exact version (the state then, paged there), ``NotOlderThan`` (now, or a 504 for
a version not reached), and the refusals.
"""

from __future__ import annotations

import pytest

from tests.kube.rawapi import Answer, Watch, call
from tests.kube.servers import ApiServer
from tests.kube.support import NODE

PODS = "/api/v1/namespaces/ns/pods"


def _names(answer: Answer) -> list[str]:
    assert answer.status == 200, answer.body
    return [str(item["metadata"]["name"]) for item in answer.body["items"]]


def _list(server: ApiServer, **query: str) -> Answer:
    return call(server.client(), "GET", PODS, query=query)


def test_a_list_without_a_resource_version_reads_every_write_before_it(
    apiserver: ApiServer,
) -> None:
    """Read your writes: each write is in the next list at once, at a resourceVersion no
    older than the write's; a watch from that version sees only what comes after."""
    for i in range(4):
        made = apiserver.add_pod("ns", f"p{i}", node=NODE)
        listed = _list(apiserver)
        assert _names(listed) == [f"p{j}" for j in range(i + 1)]
        assert int(listed.rv) >= int(made["metadata"]["resourceVersion"])
    watch = Watch(apiserver.client(), PODS, {"resourceVersion": listed.rv})
    try:
        apiserver.add_pod("ns", "after", node=NODE)
        assert watch.take(1) == [("ADDED", "after")]
    finally:
        watch.close()


def test_resource_version_zero_lists_everything_in_one_page(apiserver: ApiServer) -> None:
    """``resourceVersion=0`` (any version: the real server answers from its watch cache)
    ignores ``limit``: one page, no continue token."""
    for i in range(3):
        apiserver.add_pod("ns", f"p{i}", node=NODE)
    _list(apiserver)  # a consistent read: the cache has caught up with the writes
    answer = _list(apiserver, resourceVersion="0", limit="1")
    assert _names(answer) == ["p0", "p1", "p2"]
    assert "continue" not in answer.body["metadata"]


def test_an_exact_list_is_the_state_at_that_version(apiserver: ApiServer) -> None:
    """``resourceVersionMatch=Exact`` (or, the legacy reading, a version with a
    ``limit`` and no match) lists the state at that version, paged at it: a pod created
    after it absent, one deleted after it present; a version alone (or NotOlderThan)
    is the state now."""
    apiserver.add_pod("ns", "p0", node=NODE)
    apiserver.add_pod("ns", "p1", node=NODE)
    then = apiserver.resource_version()
    apiserver.add_pod("ns", "p2", node=NODE)
    apiserver.delete_pod("ns", "p0")
    exact = _list(apiserver, resourceVersion=then, resourceVersionMatch="Exact")
    assert (_names(exact), exact.rv) == (["p0", "p1"], then)
    paged = _list(apiserver, resourceVersion=then, resourceVersionMatch="Exact", limit="1")
    assert (_names(paged), paged.rv) == (["p0"], then)
    rest = _list(apiserver, limit="1", **{"continue": paged.body["metadata"]["continue"]})
    assert (_names(rest), rest.rv) == (["p1"], then)
    legacy = _list(apiserver, resourceVersion=then, limit="5")
    assert (_names(legacy), legacy.rv) == (["p0", "p1"], then)
    for query in ({"resourceVersion": then}, {"resourceVersion": then, "limit": "0"}):
        now = _list(apiserver, **query)
        assert _names(now) == ["p1", "p2"]
        assert int(now.rv) > int(then)
    newer = _list(apiserver, resourceVersion=then, resourceVersionMatch="NotOlderThan")
    assert _names(newer) == ["p1", "p2"]


def test_a_version_not_yet_reached_is_a_504(apiserver: ApiServer) -> None:
    """A list not older than a version the server has not reached waits for it (3 s on
    the real watch cache), then answers 504 Timeout (ResourceVersionTooLarge)."""
    ahead = str(int(apiserver.resource_version()) + 1000)
    answer = _list(apiserver, resourceVersion=ahead)
    assert (answer.status, answer.reason) == (504, "Timeout")
    assert "Too large resource version" in answer.body["message"]
    causes = answer.body["details"]["causes"]
    assert [c["reason"] for c in causes] == ["ResourceVersionTooLarge"]


@pytest.mark.parametrize(
    ("query", "status", "reason"),
    [
        ({"resourceVersionMatch": "NotOlderThan"}, 422, "Invalid"),  # a match needs a version
        ({"resourceVersion": "5", "resourceVersionMatch": "Bogus"}, 422, "Invalid"),
        ({"resourceVersion": "0", "resourceVersionMatch": "Exact"}, 422, "Invalid"),
        ({"resourceVersion": "abc"}, 400, "BadRequest"),
        ({"limit": "abc"}, 400, "BadRequest"),
        ({"continue": "abc"}, 400, "BadRequest"),
        (
            {"watch": "true", "resourceVersion": "5", "resourceVersionMatch": "Exact"},
            422,
            "Invalid",
        ),
    ],
)
def test_refused_list_options(
    apiserver: ApiServer, query: dict[str, str], status: int, reason: str
) -> None:
    """resourceVersionMatch without a resourceVersion, an unknown one, Exact at 0, or on
    a watch (422 Invalid, on ListOptions); a version, a limit or a continue token that
    does not parse (400)."""
    answer = _list(apiserver, **query)
    assert (answer.status, answer.reason) == (status, reason)
    if status == 422:
        assert answer.body["details"]["kind"] == "ListOptions"


def test_continue_refuses_a_version_and_a_negative_limit_is_none(apiserver: ApiServer) -> None:
    """A continue token with a resourceVersion is 400; a negative limit means no limit."""
    for i in range(2):
        apiserver.add_pod("ns", f"p{i}", node=NODE)
    page = _list(apiserver, limit="1")
    token = page.body["metadata"]["continue"]
    refused = _list(apiserver, limit="1", resourceVersion=page.rv, **{"continue": token})
    assert (refused.status, refused.reason) == (400, "BadRequest")
    unlimited = _list(apiserver, limit="-1")
    assert _names(unlimited) == ["p0", "p1"]
    assert "continue" not in unlimited.body["metadata"]


def test_a_watch_from_a_version_that_does_not_parse_is_a_500(apiserver: ApiServer) -> None:
    """A watch's resourceVersion that is no unsigned integer: 500 with a Status that has
    no reason (the real server's answer, oddly not a 400 as for a list)."""
    answer = _list(apiserver, watch="true", resourceVersion="abc")
    assert (answer.status, answer.body["kind"], answer.body["code"]) == (500, "Status", 500)
    assert "reason" not in answer.body
