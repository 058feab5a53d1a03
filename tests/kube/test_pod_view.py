"""The Kubernetes pod view in normal operation: list, watch, bookmarks, steady state.

The real ``kubernetes`` client talks HTTP to the fake API server; nothing is mocked.
"""

from __future__ import annotations

import pytest

from capwatch.kit.errors import PodViewError
from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.kube.conftest import ViewFactory
from tests.kube.support import NODE, OTHER_NODE, is_synced, names, wait_until, wait_watching

SELECTOR = f"spec.nodeName={NODE}"


def test_snapshot_raises_until_the_initial_list_completes(
    kube_apiserver: FakeKubeApiServer, make_view: ViewFactory
) -> None:
    """Before the first LIST has answered, snapshot() raises PodViewError saying so;
    once it answers, the snapshot holds the listed pods."""
    kube_apiserver.add_pod("ns", "a", node=NODE)
    unstarted = make_view(start=False)
    with pytest.raises(PodViewError, match="initial list"):
        unstarted.snapshot()

    kube_apiserver.hang_next_lists(0.2)
    view = make_view()
    wait_until(lambda: kube_apiserver.count("list") == 1, what="the list request")
    with pytest.raises(PodViewError, match="not synced"):
        view.snapshot()
    wait_until(lambda: is_synced(view), what="sync after the hung list answers")
    assert names(view) == {"ns/a"}


def test_initial_list_pages_through_all_namespaces_with_annotations(
    kube_apiserver: FakeKubeApiServer, make_view: ViewFactory
) -> None:
    """The LIST is paged with limit/continue, spans namespaces, carries annotations
    and the list's resourceVersion, and is filtered server-side by spec.nodeName."""
    for i in range(5):
        kube_apiserver.add_pod(f"ns{i % 2}", f"p{i}", node=NODE, annotations={"k": f"v{i}"})
    kube_apiserver.add_pod("ns0", "elsewhere", node=OTHER_NODE)
    view = make_view(page_size=2)
    wait_watching(kube_apiserver, view)

    snap = view.snapshot()
    assert {str(p.ref) for p in snap.pods.values()} == {
        "ns0/p0",
        "ns1/p1",
        "ns0/p2",
        "ns1/p3",
        "ns0/p4",
    }
    assert {p.ref.name: dict(p.annotations) for p in snap.pods.values()}["p3"] == {"k": "v3"}
    assert all(uid == info.ref.uid for uid, info in snap.pods.items())
    assert snap.resource_version == str(kube_apiserver.resource_version)
    lists = kube_apiserver.requests("list")
    assert len(lists) == 3 == view.stats().list_requests
    assert all(r.query["fieldSelector"] == SELECTOR and r.query["limit"] == "2" for r in lists)
    assert all(r.path == "/api/v1/pods" for r in lists)
    assert "continue" not in lists[0].query
    assert lists[1].query["continue"]
    assert lists[2].query["continue"]


def test_watch_events_are_applied_to_the_cache(
    kube_apiserver: FakeKubeApiServer, make_view: ViewFactory
) -> None:
    """ADDED, MODIFIED (annotation change) and DELETED from the watch show up in
    later snapshots; earlier snapshots are immutable and unchanged."""
    kube_apiserver.add_pod("ns", "stays", node=NODE, annotations={"w": "100"})
    kube_apiserver.add_pod("ns", "goes", node=NODE)
    view = make_view()
    wait_watching(kube_apiserver, view)
    before = view.snapshot()

    kube_apiserver.add_pod("ns", "new", node=NODE, annotations={"w": "250"})
    kube_apiserver.update_pod("ns", "stays", annotations={"w": "300"})
    kube_apiserver.delete_pod("ns", "goes")
    wait_until(
        lambda: view.snapshot().resource_version == str(kube_apiserver.resource_version),
        what="watch catching up",
    )

    after = view.snapshot()
    by_name = {p.ref.name: dict(p.annotations) for p in after.pods.values()}
    assert by_name == {"stays": {"w": "300"}, "new": {"w": "250"}}
    assert {p.ref.name for p in before.pods.values()} == {"stays", "goes"}
    with pytest.raises(TypeError):
        before.pods["x"] = before.pods[next(iter(before.pods))]  # type: ignore[index]
    assert kube_apiserver.count("list") == 1
    assert view.stats().watch_events == 3


def test_a_pod_newly_bound_here_nudges_the_agent_and_a_change_does_not(
    kube_apiserver: FakeKubeApiServer, make_view: ViewFactory
) -> None:
    """on_new_pod (the agent's nudge toward an early cycle, so a new pod's cap is in place
    before its first process) hears of the initial list's pods and of each pod that
    arrives later, not of changes to pods it holds nor of deletions."""
    kube_apiserver.add_pod("ns", "first", node=NODE)
    told: list[str] = []
    view = make_view(on_new_pod=lambda: told.append("new"))
    wait_watching(kube_apiserver, view)
    assert told == ["new"]
    kube_apiserver.update_pod("ns", "first", annotations={"w": "300"})
    kube_apiserver.add_pod("ns", "second", node=NODE)
    kube_apiserver.delete_pod("ns", "first")
    wait_until(
        lambda: view.snapshot().resource_version == str(kube_apiserver.resource_version),
        what="watch catching up",
    )
    assert told == ["new", "new"]


def test_pods_on_other_nodes_never_appear(
    kube_apiserver: FakeKubeApiServer, make_view: ViewFactory
) -> None:
    """Only pods bound to this node are cached: the field selector is sent on every
    request, and a pod moving off the node leaves the view (and one moving on joins)."""
    kube_apiserver.add_pod("ns", "mine", node=NODE)
    kube_apiserver.add_pod("ns", "theirs", node=OTHER_NODE)
    view = make_view()
    wait_watching(kube_apiserver, view)
    assert names(view) == {"ns/mine"}

    kube_apiserver.add_pod("ns", "theirs-too", node=OTHER_NODE)
    kube_apiserver.update_pod("ns", "theirs", node=NODE)
    kube_apiserver.update_pod("ns", "mine", node=OTHER_NODE)
    wait_until(lambda: names(view) == {"ns/theirs"}, what="moves reflected")

    kube_apiserver.add_pod("ns", "marker", node=NODE)
    wait_until(lambda: "ns/marker" in names(view), what="marker pod")
    assert names(view) == {"ns/theirs", "ns/marker"}
    assert all(r.query.get("fieldSelector") == SELECTOR for r in kube_apiserver.requests())


def test_bookmarks_advance_resource_version_and_avoid_a_relist(
    kube_apiserver: FakeKubeApiServer, make_view: ViewFactory
) -> None:
    """A BOOKMARK moves the view's resourceVersion past changes it cannot see, so a
    watch restarted after compaction resumes from it with no 410 and no LIST."""
    kube_apiserver.add_pod("ns", "a", node=NODE)
    view = make_view()
    wait_watching(kube_apiserver, view)
    watch = kube_apiserver.requests("watch")[0]
    assert watch.query["allowWatchBookmarks"] == "true"

    for i in range(3):
        kube_apiserver.add_pod("ns", f"other-{i}", node=OTHER_NODE)
    target = str(kube_apiserver.resource_version)
    assert view.snapshot().resource_version != target
    kube_apiserver.bookmark()
    wait_until(lambda: view.snapshot().resource_version == target, what="bookmark applied")

    kube_apiserver.compact()
    kube_apiserver.drop_watches()
    wait_until(lambda: kube_apiserver.count("watch") == 2, what="watch restart")
    kube_apiserver.add_pod("ns", "b", node=NODE)
    # Reaching the view proves the new watch works; a relist would have come first.
    wait_until(lambda: names(view) == {"ns/a", "ns/b"}, what="event after restart")
    assert kube_apiserver.requests("watch")[1].query["resourceVersion"] == target
    assert kube_apiserver.count("list") == 1
    assert view.stats().relists == 0


def test_dropped_watch_resumes_from_last_resource_version_without_list(
    kube_apiserver: FakeKubeApiServer, make_view: ViewFactory
) -> None:
    """A watch connection cut mid-stream is re-opened from the last resourceVersion
    seen, with no LIST, and events after the reconnect are applied."""
    view = make_view()
    wait_watching(kube_apiserver, view)
    kube_apiserver.add_pod("ns", "a", node=NODE)
    wait_until(lambda: names(view) == {"ns/a"}, what="first event")
    seen = view.snapshot().resource_version

    kube_apiserver.drop_watches()
    wait_until(lambda: kube_apiserver.count("watch") == 2, what="watch restart")
    assert kube_apiserver.requests("watch")[1].query["resourceVersion"] == seen
    kube_apiserver.add_pod("ns", "b", node=NODE)
    wait_until(lambda: names(view) == {"ns/a", "ns/b"}, what="event after reconnect")
    assert kube_apiserver.count("list") == 1
    assert view.stats().relists == 0
    assert view.stats().errors == 1


def test_watch_ended_by_server_resumes_without_list_or_error(
    kube_apiserver: FakeKubeApiServer, make_view: ViewFactory
) -> None:
    """Watches ask for a jittered server-side timeoutSeconds between 1/2 and 2/3 of the
    silence bound; when the server ends the stream normally the view re-watches at
    once, counting no error and no LIST."""
    view = make_view(silence_bound=600)
    wait_watching(kube_apiserver, view)
    kube_apiserver.end_watches()
    wait_until(lambda: kube_apiserver.count("watch") == 2, what="watch restart")
    kube_apiserver.add_pod("ns", "a", node=NODE)
    wait_until(lambda: names(view) == {"ns/a"}, what="event after restart")

    timeouts = [int(r.query["timeoutSeconds"]) for r in kube_apiserver.requests("watch")]
    assert all(300 <= t <= 400 for t in timeouts)
    assert kube_apiserver.count("list") == 1
    assert view.stats().errors == 0
    assert is_synced(view)


def test_steady_state_many_events_make_no_list(
    kube_apiserver: FakeKubeApiServer, make_view: ViewFactory
) -> None:
    """Hundreds of watch events on one open watch: zero additional LIST or WATCH
    requests, and the cache ends equal to the server's state."""
    view = make_view()
    wait_watching(kube_apiserver, view)
    for i in range(100):
        kube_apiserver.add_pod("ns", f"p{i}", node=NODE if i % 3 else OTHER_NODE)
    for i in range(0, 100, 2):
        kube_apiserver.update_pod("ns", f"p{i}", annotations={"n": str(i)})
    for i in range(0, 100, 5):
        kube_apiserver.delete_pod("ns", f"p{i}")
    wait_until(
        lambda: view.snapshot().resource_version == str(kube_apiserver.resource_version),
        what="watch catching up",
    )

    expected = {f"ns/p{i}" for i in range(100) if i % 3 and i % 5}
    assert names(view) == expected
    annotated = {p.ref.name: dict(p.annotations) for p in view.snapshot().pods.values()}
    assert annotated["p4"] == {"n": "4"}
    assert annotated["p7"] == {}
    assert kube_apiserver.count("list") == 1
    assert kube_apiserver.count("watch") == 1
    assert view.stats().list_requests == 1


def test_a_namespaced_view_lists_and_watches_one_namespace_only(
    kube_apiserver: FakeKubeApiServer, make_view: ViewFactory
) -> None:
    """With a namespace (a namespaced Role), LIST and WATCH use that namespace's path:
    pods of this node in other namespaces never appear, before or after the list."""
    kube_apiserver.add_pod("gpu-jobs", "a", node=NODE)
    kube_apiserver.add_pod("elsewhere", "b", node=NODE)
    view = make_view(namespace="gpu-jobs")
    wait_until(lambda: is_synced(view), what="sync")
    assert names(view) == {"gpu-jobs/a"}
    wait_watching(kube_apiserver, view)
    kube_apiserver.add_pod("gpu-jobs", "c", node=NODE)
    kube_apiserver.add_pod("elsewhere", "d", node=NODE)
    wait_until(lambda: "gpu-jobs/c" in names(view), what="the watched pod")
    assert names(view) == {"gpu-jobs/a", "gpu-jobs/c"}
    paths = {record.path for record in kube_apiserver.requests()}
    assert paths == {"/api/v1/namespaces/gpu-jobs/pods"}
