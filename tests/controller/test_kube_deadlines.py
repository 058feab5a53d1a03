"""The API client's deadlines, checked where the request leaves (controller/kube.py).

A call is handed to the client's thread pool and sent whenever a thread gets to
it: after the calls queued before it, or after the process was paused. The
deadline it carries is an instant, checked on the sending thread immediately
before the request goes out; a request whose deadline has passed is not sent
at all, and one that is sent gets no more time than is left. Over the fake API
server on port 0 through capwatch's transport; time is a fake clock, and
the pool's one thread is held by the test, so nothing here waits on the wall
clock.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from capwatch.controller.conditions import ConditionStatus, NodeCondition
from capwatch.controller.errors import ApiError, DeadlinePassed
from capwatch.controller.kube import KubeApi
from capwatch.controller.writes.recorder import EventType, NodeEvent
from capwatch.kit.clock import FakeClock
from capwatch.kube.access import ClusterAccess
from capwatch.kube.transport import ApiTransport
from tests.fakes.kube_apiserver import FakeKubeApiServer

pytestmark = pytest.mark.asyncio(loop_factories=["real"])  # the pool's threads
WALL = 1_740_823_200.0
CONDITION = NodeCondition(
    status=ConditionStatus.FALSE,
    reason="CapWriteFailed",
    message="gpu1: write_failed",
    last_transition_wall=WALL,
    last_heartbeat_wall=WALL,
)


@pytest.fixture
def fake() -> Iterator[FakeKubeApiServer]:
    server = FakeKubeApiServer()
    server.start()
    server.add_node("n1")
    yield server
    server.stop()


class Rig:
    """A KubeApi with one pool thread, which :meth:`hold` keeps busy until released."""

    def __init__(self, fake: FakeKubeApiServer) -> None:
        self.client = ApiTransport(ClusterAccess(server=fake.url), user_agent="test")
        self.clock = FakeClock()
        self.api = KubeApi(
            self.client, namespace="capwatch", identity="r0", max_threads=1, clock=self.clock
        )
        self.timeouts: list[Any] = []
        send = self.client.request

        def recording(*args: Any, **kwargs: Any) -> Any:
            self.timeouts.append(kwargs.get("timeout"))
            return send(*args, **kwargs)

        self.client.request = recording  # type: ignore[method-assign]

    def hold(self) -> threading.Event:
        """Occupy the pool's thread (as calls queued ahead would) until the event is set."""
        release = threading.Event()
        self.api._pool.submit(release.wait, 30)
        return release

    def close(self) -> None:
        self.api.close()
        self.client.close()


@pytest.fixture
def rig(fake: FakeKubeApiServer) -> Iterator[Rig]:
    made = Rig(fake)
    yield made
    made.close()


async def queued(call: Any) -> asyncio.Task[Any]:
    """``call`` started and handed to the pool (its thread is held)."""
    task = asyncio.ensure_future(call)
    for _ in range(5):
        await asyncio.sleep(0)
    assert not task.done()
    return task


async def test_a_write_whose_deadline_passes_before_its_thread_runs_is_not_sent(
    rig: Rig, fake: FakeKubeApiServer
) -> None:
    """A condition PATCH and an Event handed to the pool with 5 s left, whose thread only
    gets to them 6 s later (a SIGSTOP, a busy pool), raise DeadlinePassed and never reach
    the API server; the same calls inside their deadline do."""
    release = rig.hold()
    deadline = rig.clock.monotonic() + 5.0
    patch = await queued(rig.api.apply_condition("n1", CONDITION, deadline=deadline))
    event = NodeEvent(node="n1", type=EventType.WARNING, reason="R", message="m", wall=WALL)
    post = await queued(rig.api.create_event(event, deadline=deadline))
    rig.clock.advance(6.0)
    release.set()
    for task in (patch, post):
        with pytest.raises(DeadlinePassed, match=r"not sent, its deadline passed 1\.000s ago"):
            await task
    assert fake.requests() == []
    assert fake.node_status_writes() == []
    assert rig.timeouts == []  # the transport was never reached

    await rig.api.apply_condition("n1", CONDITION, deadline=rig.clock.monotonic() + 5.0)
    await rig.api.create_event(event, deadline=rig.clock.monotonic() + 5.0)
    assert len(fake.node_status_writes("n1")) == 1
    assert len(fake.events()) == 1


async def test_a_deadline_that_passes_exactly_when_the_thread_runs_is_not_sent(
    rig: Rig, fake: FakeKubeApiServer
) -> None:
    """At the deadline itself nothing is left: not sent (and not sent with a timeout of 0,
    which the client would read as no timeout at all)."""
    release = rig.hold()
    patch = await queued(
        rig.api.apply_condition("n1", CONDITION, deadline=rig.clock.monotonic() + 2.0)
    )
    rig.clock.advance(2.0)
    release.set()
    with pytest.raises(DeadlinePassed):
        await patch
    assert fake.requests() == []


async def test_a_request_gets_only_what_is_left_of_its_deadline(rig: Rig) -> None:
    """Handed over with 5 s left and sent 3.5 s later, the request's timeout is the 1.5 s
    left, as one total for connect and read; relative deadlines (the Lease calls) count
    from when the call was made, not from when its thread ran."""
    release = rig.hold()
    patch = await queued(
        rig.api.apply_condition("n1", CONDITION, deadline=rig.clock.monotonic() + 5.0)
    )
    lease = await queued(rig.api.get_lease("capwatch-controller-0", deadline_s=4.0))
    rig.clock.advance(3.5)
    release.set()
    await patch
    assert await lease is None
    assert rig.timeouts == [pytest.approx(1.5), pytest.approx(0.5)]


async def test_a_relative_deadline_that_passed_in_the_queue_is_not_sent(
    rig: Rig, fake: FakeKubeApiServer
) -> None:
    """A Lease read with 4 s allowed, reached 4.5 s later, is dropped like a write: the
    elector sees a failed attempt (an ApiError), and the server sees nothing."""
    release = rig.hold()
    lease = await queued(rig.api.get_lease("capwatch-controller-0", deadline_s=4.0))
    rig.clock.advance(4.5)
    release.set()
    with pytest.raises(ApiError) as raised:
        await lease
    assert isinstance(raised.value, DeadlinePassed)
    assert fake.requests() == []


class PausedAfter(FakeClock):
    """A clock that jumps ``pause_s`` once it has been read ``reads`` times: the process
    paused at that point of sending a request."""

    def __init__(self, *, reads: int, pause_s: float) -> None:
        super().__init__()
        self._left, self._pause_s = reads, pause_s

    def monotonic(self) -> float:
        now = super().monotonic()
        self._left -= 1
        if self._left == 0:
            self.advance(self._pause_s)
        return now


@pytest.mark.parametrize(
    ("reads", "where"),
    [(1, "before the headers go out"), (2, "between the headers and the body")],
)
async def test_a_pause_inside_the_client_library_stops_the_request_at_its_connection(
    fake: FakeKubeApiServer, reads: int, where: str
) -> None:
    """The deadline is checked again at every write of the request's bytes: a pause after
    the first check (in urllib3, say) that outlasts the deadline stops the request before
    its headers go out; one between the headers and the body stops the body, and the API
    server applies nothing (it never got a whole request). DeadlinePassed either way."""
    client = ApiTransport(ClusterAccess(server=fake.url), user_agent="test")
    # Read once on the loop (the deadline) and once before the request, then by each send.
    clock = PausedAfter(reads=1 + reads, pause_s=10.0)
    deadline = clock.monotonic() + 5.0
    api = KubeApi(client, namespace="capwatch", identity="r0", clock=clock)
    try:
        with pytest.raises(DeadlinePassed, match=r"PATCH /api/v1/nodes/n1/status: not sent"):
            await api.apply_condition("n1", CONDITION, deadline=deadline)
    finally:
        api.close()
        client.close()
    assert fake.node_status_writes() == [], where
    if reads == 1:
        assert fake.requests() == []


async def test_a_call_takes_one_deadline_or_the_other(rig: Rig) -> None:
    """``deadline`` (an instant) and ``deadline_s`` (seconds from now) are exclusive, and
    one of them is required."""
    with pytest.raises(TypeError, match="one of the two"):
        await rig.api.apply_condition("n1", CONDITION)
    with pytest.raises(TypeError, match="one of the two"):
        await rig.api.apply_condition("n1", CONDITION, deadline=1.0, deadline_s=1.0)
