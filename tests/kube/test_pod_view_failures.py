"""The Kubernetes pod view under failure: 410 Gone, 429/500, broken or dead watches,
staleness, recovery, and shutdown. Real client, fake API server, real sockets."""

from __future__ import annotations

import logging
import random
import re
import threading
import time

import pytest

from capwatch.kit.clock import SystemClock
from capwatch.kit.errors import PodViewError
from tests.fakes.kube_apiserver import FakeKubeApiServer, GoneMode
from tests.kube.conftest import ViewFactory
from tests.kube.support import NODE, OTHER_NODE, is_synced, names, wait_until, wait_watching

RETRY_IN = re.compile(r"retry_in=([0-9.]+)s")


class RecordingClock(SystemClock):
    """The real clocks, keeping every wait the view asks for: its backoff sleeps, exactly
    as decided, where the gaps between its requests also hold scheduling delays."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    def sleep(self, seconds: float, stop: threading.Event | None = None) -> bool:
        self.sleeps.append(seconds)
        return super().sleep(seconds, stop)


class TopOfRange(random.Random):
    """A 'random' source whose jitter always picks the longest allowed wait."""

    def uniform(self, a: float, b: float) -> float:
        return b


def _miss_events_then_expire(server: FakeKubeApiServer) -> None:
    """Cut the watch, change pods while no watcher can see it, compact the history:
    the view's next watch asks for a resourceVersion the server no longer has."""
    with server.atomic():
        server.drop_watches()
        server.delete_pod("ns", "old")
        server.add_pod("ns", "new", node=NODE)
        server.update_pod("ns", "kept", annotations={"w": "2"})
        server.compact()


@pytest.mark.parametrize("gone_mode", ["http", "event"])
def test_gone_causes_exactly_one_relist(
    kube_apiserver: FakeKubeApiServer, make_view: ViewFactory, gone_mode: GoneMode
) -> None:
    """A 410 Gone on the watch, as an HTTP 410 or as an ERROR event carrying a 410
    Status, makes the view relist exactly once; the cache then matches the server
    and watching resumes from the new list."""
    kube_apiserver.gone_mode = gone_mode
    kube_apiserver.add_pod("ns", "old", node=NODE)
    kube_apiserver.add_pod("ns", "kept", node=NODE, annotations={"w": "1"})
    view = make_view()
    wait_watching(kube_apiserver, view)
    stale_rv = view.snapshot().resource_version

    _miss_events_then_expire(kube_apiserver)
    wait_until(lambda: kube_apiserver.count("list") == 2, what="relist")
    wait_until(lambda: kube_apiserver.count("watch") == 3, what="watch after relist")
    wait_until(lambda: kube_apiserver.open_watches == 1, what="watch open")

    assert names(view) == {"ns/kept", "ns/new"}
    kept = next(p for p in view.snapshot().pods.values() if p.ref.name == "kept")
    assert dict(kept.annotations) == {"w": "2"}
    watches = kube_apiserver.requests("watch")
    assert watches[1].query["resourceVersion"] == stale_rv
    assert watches[2].query["resourceVersion"] == str(kube_apiserver.resource_version)
    assert view.stats().relists == 1
    kube_apiserver.add_pod("ns", "later", node=NODE)
    wait_until(lambda: "ns/later" in names(view), what="event after relist")
    assert kube_apiserver.count("list") == 2


@pytest.mark.parametrize("code", [500, 429])
def test_failing_lists_are_retried_until_they_succeed(
    kube_apiserver: FakeKubeApiServer, make_view: ViewFactory, code: int
) -> None:
    """LISTs answered 500 or 429 (with Status bodies) are retried with backoff; the
    view stays unsynced meanwhile and syncs once the server answers again."""
    kube_apiserver.add_pod("ns", "a", node=NODE)
    kube_apiserver.fail_next("list", code, count=3)
    view = make_view()
    wait_until(lambda: is_synced(view), what="sync after failures")
    assert names(view) == {"ns/a"}
    assert kube_apiserver.count("list") == 4
    stats = view.stats()
    assert (stats.list_requests, stats.errors, stats.relists) == (4, 3, 0)


def test_backoff_doubles_between_retries(
    kube_apiserver: FakeKubeApiServer, make_view: ViewFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Consecutive failures wait by the one backoff (kit/backoff.py): failure n waits at
    most initial * 2**n (full jitter below that ceiling), so the ceilings double."""
    kube_apiserver.fail_next("list", 500, count=4)
    with caplog.at_level(logging.WARNING, logger="capwatch.kube.informer"):
        view = make_view(backoff_initial=0.02, backoff_max=5.0)
        wait_until(lambda: is_synced(view), what="sync after failures")
    waits = [float(m[1]) for r in caplog.records if (m := RETRY_IN.search(r.getMessage()))]
    assert len(waits) == 4
    for attempt, wait in enumerate(waits):
        assert 0 <= wait <= 0.02 * 2**attempt + 0.005, (attempt, waits)  # printed to 0.01 s
    assert kube_apiserver.count("list") == 5


def test_backoff_is_capped(kube_apiserver: FakeKubeApiServer, make_view: ViewFactory) -> None:
    """However many failures, no wait exceeds backoff_max: with the jitter at the top of
    its range the waits are the ceilings, doubling from backoff_initial up to the cap."""
    kube_apiserver.fail_next("list", 500, count=8)
    clock = RecordingClock()
    view = make_view(backoff_initial=0.01, backoff_max=0.03, clock=clock, rng=TopOfRange())
    wait_until(lambda: is_synced(view), what="sync after failures")
    assert clock.sleeps == [0.01, 0.02] + [0.03] * 6
    assert kube_apiserver.count("list") == 9


def test_retry_after_on_429_is_honoured_up_to_the_cap(
    kube_apiserver: FakeKubeApiServer, make_view: ViewFactory
) -> None:
    """A 429 with Retry-After: 1 delays the retry to min(1 s, backoff_max), far longer
    than the tiny exponential backoff would."""
    kube_apiserver.fail_next("list", 429, retry_after=1)
    clock = RecordingClock()
    view = make_view(backoff_initial=0.005, backoff_max=0.2, clock=clock)
    wait_until(lambda: is_synced(view), what="sync after 429")
    assert clock.sleeps == [0.2]  # the exponential backoff's ceiling was 0.005 s
    first, second = (r.at for r in kube_apiserver.requests("list"))
    assert second - first >= 0.19  # and it was waited out before the retry


def test_watch_errors_retry_the_watch_not_the_list(
    kube_apiserver: FakeKubeApiServer, make_view: ViewFactory
) -> None:
    """A watch answered 500 or 429 is retried (with backoff) from the same
    resourceVersion; only 410 justifies a LIST."""
    view = make_view()
    wait_watching(kube_apiserver, view)
    kube_apiserver.add_pod("ns", "a", node=NODE)
    wait_until(lambda: names(view) == {"ns/a"}, what="first event")
    kube_apiserver.fail_next("watch", 500, count=2)
    kube_apiserver.fail_next("watch", 429, count=1)
    kube_apiserver.drop_watches()
    wait_until(lambda: kube_apiserver.open_watches == 1, what="watch back")
    kube_apiserver.add_pod("ns", "b", node=NODE)
    wait_until(lambda: names(view) == {"ns/a", "ns/b"}, what="event after recovery")
    rvs = {r.query["resourceVersion"] for r in kube_apiserver.requests("watch")[1:]}
    assert len(rvs) == 1
    assert kube_apiserver.count("watch") == 5
    assert kube_apiserver.count("list") == 1
    assert view.stats().relists == 0


def test_error_event_other_than_410_retries_the_watch(
    kube_apiserver: FakeKubeApiServer, make_view: ViewFactory
) -> None:
    """An ERROR event carrying a non-410 Status (here 500) on an open stream counts
    as an error and re-watches from the same resourceVersion; it is not a relist."""
    view = make_view()
    wait_watching(kube_apiserver, view)
    kube_apiserver.fail_next("watch", 500, in_stream=True)
    kube_apiserver.drop_watches()
    kube_apiserver.add_pod("ns", "a", node=NODE)
    wait_until(lambda: names(view) == {"ns/a"}, what="event after the ERROR event")
    watches = kube_apiserver.requests("watch")
    assert len(watches) == 3
    assert watches[1].query["resourceVersion"] == watches[2].query["resourceVersion"]
    stats = view.stats()
    assert (stats.errors, stats.relists, stats.list_requests) == (2, 0, 1)


def test_view_goes_stale_when_relists_keep_failing_and_recovers(
    kube_apiserver: FakeKubeApiServer, make_view: ViewFactory
) -> None:
    """After a 410 with every relist failing, the snapshot keeps serving for
    stale_after seconds, then raises PodViewError naming the cause; once lists work
    again the view is synced with the server's current pods."""
    kube_apiserver.add_pod("ns", "old", node=NODE)
    kube_apiserver.add_pod("ns", "kept", node=NODE)
    view = make_view(stale_after=0.3)
    wait_watching(kube_apiserver, view)

    kube_apiserver.fail_next("list", 500, count=10_000)
    went_down = time.monotonic()
    _miss_events_then_expire(kube_apiserver)
    wait_until(lambda: not is_synced(view), what="view going stale")
    assert time.monotonic() - went_down >= 0.3
    with pytest.raises(PodViewError, match=r"stale.*HTTP 500"):
        view.snapshot()
    assert kube_apiserver.count("list") > 3
    assert view.stats().relists == 1

    kube_apiserver.clear_faults()
    wait_until(lambda: is_synced(view), what="recovery")
    assert names(view) == {"ns/kept", "ns/new"}


def test_view_goes_stale_when_the_watch_cannot_reconnect(
    kube_apiserver: FakeKubeApiServer, make_view: ViewFactory
) -> None:
    """Watch requests failing for longer than stale_after make the view unsynced;
    a successful reconnect makes it synced again, without any LIST."""
    kube_apiserver.add_pod("ns", "a", node=NODE)
    view = make_view(stale_after=0.3)
    wait_watching(kube_apiserver, view)
    kube_apiserver.fail_next("watch", 500, count=10_000)
    kube_apiserver.drop_watches()
    wait_until(lambda: not is_synced(view), what="view going stale")
    kube_apiserver.clear_faults()
    wait_until(lambda: is_synced(view), what="recovery")
    assert names(view) == {"ns/a"}
    assert kube_apiserver.count("list") == 1


def _view_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"capwatch-podview-{NODE}"]


def test_close_stops_the_thread_promptly_mid_watch(
    kube_apiserver: FakeKubeApiServer, make_view: ViewFactory
) -> None:
    """close() during an open, idle watch cuts it and ends the daemon thread, and the
    closed view refuses to serve snapshots."""
    view = make_view(silence_bound=600)
    wait_watching(kube_apiserver, view)
    wait_until(lambda: kube_apiserver.open_watches == 1, what="watch open")
    assert [t.daemon for t in _view_threads()] == [True]

    view.close()
    # A hang guard, not a speed claim: a watch close() failed to cut would hold the
    # thread for its 5-minute timeout (no byte for up to the 600 s silence bound).
    wait_until(lambda: not _view_threads(), timeout=5.0, what="thread exit")
    with pytest.raises(PodViewError, match="closed"):
        view.snapshot()
    view.close()  # idempotent


def test_close_returns_promptly_while_a_list_hangs(
    kube_apiserver: FakeKubeApiServer, make_view: ViewFactory
) -> None:
    """close() waits for the thread its close_timeout, then returns even while a LIST
    is stuck on the server (for 30 s); the thread exits when that request ends."""
    kube_apiserver.hang_next_lists(30)
    view = make_view(close_timeout=0.2)
    wait_until(lambda: kube_apiserver.count("list") == 1, what="list in flight")
    started = time.monotonic()
    view.close()
    took = time.monotonic() - started
    # Waited out the timeout (the thread was stuck), and far from the 30 s the list
    # hangs for: the upper bound only guards against close() waiting for the list.
    assert 0.2 <= took < 5, took
    kube_apiserver.stop()  # aborts the hung list
    wait_until(lambda: not _view_threads(), timeout=2.0, what="thread exit")


def test_close_interrupts_a_long_backoff(
    kube_apiserver: FakeKubeApiServer, make_view: ViewFactory
) -> None:
    """close() during a 30 s backoff sleep ends the thread without waiting it out."""
    kube_apiserver.fail_next("list", 500, count=100)
    clock = RecordingClock()
    view = make_view(backoff_initial=30.0, backoff_max=60.0, clock=clock, rng=TopOfRange())
    wait_until(lambda: clock.sleeps, what="the backoff sleep")
    assert clock.sleeps == [30.0]
    view.close()
    # A hang guard well inside the 30 s sleep, not a speed claim.
    wait_until(lambda: not _view_threads(), timeout=5.0, what="thread exit")
    assert kube_apiserver.count("list") == 1


def test_other_nodes_churn_during_outage_is_not_cached(
    kube_apiserver: FakeKubeApiServer, make_view: ViewFactory
) -> None:
    """The relist after a 410 is field-selected too: pods created on other nodes
    while the view was away do not enter the cache."""
    view = make_view()
    wait_watching(kube_apiserver, view)
    with kube_apiserver.atomic():
        kube_apiserver.drop_watches()
        kube_apiserver.add_pod("ns", "theirs", node=OTHER_NODE)
        kube_apiserver.add_pod("ns", "mine", node=NODE)
        kube_apiserver.compact()
    wait_until(lambda: kube_apiserver.count("list") == 2, what="relist")
    wait_until(lambda: names(view) == {"ns/mine"}, what="relisted cache")
