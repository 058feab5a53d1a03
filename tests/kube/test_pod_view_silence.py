"""The silence bound: a pod watch that delivers nothing (no event, no bookmark, no
clean end) for longer than the bound leaves the view unsynced and is re-opened,
while a healthy quiet watch is renewed well inside it. Real client, fake API
server, real sockets; the rule itself is read on a FakeClock where it can be."""

from __future__ import annotations

import pytest

from capwatch.kit.clock import FakeClock
from capwatch.kit.errors import PodViewError
from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.kube.conftest import ViewFactory
from tests.kube.support import NODE, is_synced, names, wait_until, wait_watching

BOUND = 30.0


def test_a_silent_watch_leaves_the_view_unsynced_once_the_bound_has_passed(
    kube_apiserver: FakeKubeApiServer, make_view: ViewFactory
) -> None:
    """A watch that stays open but goes silent keeps the view synced for the bound
    after the last delivery and no longer: then snapshot() raises PodViewError naming
    the silence (the cycle aborts). When the watch delivers again the view is synced
    with the change it had missed, and no LIST was needed."""
    clock = FakeClock()
    kube_apiserver.add_pod("ns", "a", node=NODE)
    view = make_view(clock=clock, silence_bound=BOUND)
    wait_watching(kube_apiserver, view)
    kube_apiserver.stall_watches()
    try:
        kube_apiserver.update_pod("ns", "a", annotations={"w": "1"})  # not delivered
        clock.advance(BOUND - 1)
        assert names(view) == {"ns/a"}
        clock.advance(2)
        with pytest.raises(PodViewError, match=r"nothing for 31\.0s \(silence bound 30s\)"):
            view.snapshot()
    finally:
        kube_apiserver.stall_watches(False)
    wait_until(lambda: is_synced(view), what="the watch delivering again")
    (pod,) = view.snapshot().pods.values()
    assert pod.annotations == {"w": "1"}
    assert kube_apiserver.count("list") == 1


@pytest.mark.parametrize("delivery", ["event", "bookmark", "clean end"])
def test_an_event_a_bookmark_or_a_clean_end_restarts_the_silence_clock(
    kube_apiserver: FakeKubeApiServer, make_view: ViewFactory, delivery: str
) -> None:
    """Each of a watch event, a BOOKMARK and a watch's clean end counts as the API
    server delivering: the view stays synced for the bound after it, and goes
    unsynced once the bound has passed with nothing more."""
    clock = FakeClock()
    view = make_view(clock=clock, silence_bound=BOUND)
    wait_watching(kube_apiserver, view)
    clock.advance(BOUND - 1)
    events = view.stats().watch_events
    if delivery == "event":
        kube_apiserver.add_pod("ns", "a", node=NODE)
        wait_until(lambda: view.stats().watch_events > events, what="the event")
    elif delivery == "bookmark":
        kube_apiserver.bookmark()
        wait_until(lambda: view.stats().watch_events > events, what="the bookmark")
    else:
        kube_apiserver.end_watches()
        wait_until(lambda: kube_apiserver.count("watch") == 2, what="the next watch")
    clock.advance(2)  # the bound has passed since the list, not since the delivery
    assert is_synced(view)
    clock.advance(BOUND)
    assert not is_synced(view)


def test_a_stalled_connection_is_given_up_after_the_bound_and_rewatched_without_a_list(
    kube_apiserver: FakeKubeApiServer, make_view: ViewFactory
) -> None:
    """A watch that sends no byte for the bound (the socket read timeout) is abandoned
    and re-opened from the last resourceVersion, with no LIST. Re-opening proves
    nothing (a stalled server answers the request and then says nothing), so the view
    stays unsynced until the server delivers again; then events flow."""
    view = make_view(silence_bound=2.5, stale_after=60)
    wait_watching(kube_apiserver, view)
    seen = view.snapshot().resource_version
    kube_apiserver.stall_watches()
    try:
        wait_until(lambda: view.stats().errors == 1, timeout=15, what="the read timeout")
        watches = kube_apiserver.count("watch")
        wait_until(lambda: kube_apiserver.count("watch") > watches, what="the re-watch")
        assert kube_apiserver.requests("watch")[-1].query["resourceVersion"] == seen
        assert not is_synced(view)
    finally:
        kube_apiserver.stall_watches(False)
    wait_until(lambda: is_synced(view), what="the re-opened watch delivering")
    kube_apiserver.add_pod("ns", "a", node=NODE)
    wait_until(lambda: names(view) == {"ns/a"}, what="an event after the stall")
    assert kube_apiserver.count("list") == 1


def test_a_quiet_watch_is_renewed_on_the_same_connection_with_no_error(
    kube_apiserver: FakeKubeApiServer, make_view: ViewFactory
) -> None:
    """With nothing happening, each watch asks the server to end it (timeoutSeconds
    below the bound) and the next one goes out on the same pooled connection: no
    error, no LIST, and the view is synced throughout."""
    view = make_view(silence_bound=2.5)  # timeoutSeconds=1
    wait_watching(kube_apiserver, view)
    wait_until(lambda: kube_apiserver.count("watch") >= 3, what="two renewals")
    watches = kube_apiserver.requests("watch")
    assert {w.query["timeoutSeconds"] for w in watches} == {"1"}
    assert len({w.peer for w in watches}) == 1
    assert view.stats().errors == 0
    assert kube_apiserver.count("list") == 1
    assert is_synced(view)
