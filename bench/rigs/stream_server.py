"""The server side of the stream bench, in a process of its own (bench.shared.children.Child):
one server and what drives it.

capwatch's Watch server over a hub the bench publishes into ("hub"), over a hub holding
REPLAY cycles published beforehand ("replay"), or over the real agent loop on the benches'
node ("agent"); or the bare floor, sending the same message ("bare-loop",
"bare-broadcast": bench.floors.watch_server.BareWatch). Beside the server: when the
cyclic collector's full passes ran, the process's RSS, CPU and messages sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.floors.watch_server import BareWatch
from bench.rigs.node import build_world, gpu_uuid, memory_pods, reconciler_for
from bench.shared.procs import status_kib
from capwatch.agent.devices import inventory
from capwatch.agent.dra.claims import NoClaims
from capwatch.agent.hub import Hub
from capwatch.agent.pods import PodRef
from capwatch.agent.reports import CapSource, CycleReport, GpuResult, Outcome, Reason
from capwatch.agent.running import AgentLoop, CycleThread
from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.kit.clock import SystemClock
from capwatch.kit.heap import settle_heap
from capwatch.server.grpc import mapping
from capwatch.server.grpc.publication import Publication
from capwatch.server.grpc.serving import AgentServer
from tests.server.harness import settings_for

GPUS = 8
CAPACITY = 256  # the hub's default ring
# Throughput replays cycles published beforehand: a ring this long outlasts a
# round (0.5 s warm-up, 3 s measured) at up to 25,000 messages/s.
REPLAY = 100_000
INTERVAL_S = 15.0  # the agent's default: no heartbeat fires during a measurement
UUIDS = tuple(f"GPU-5e5e5e5e-0000-4000-8000-{i:012d}" for i in range(GPUS))
AGENT_UUIDS = tuple(gpu_uuid(i) for i in range(GPUS))  # the benches' node's
POD = PodRef(namespace="ml", name="trainer", uid="aaaaaaaa-0000-4000-8000-000000000001")
RESULTS = tuple(
    GpuResult(
        index=i,
        uuid=UUIDS[i],
        outcome=Outcome.ENFORCED,
        reason=Reason.OK,
        message="capped at 350 W (annotation)",
        owners=(POD,),
        requested_watts=350,
        resolved_watts=350,
        applied_watts=350,
        cap_source=CapSource.ANNOTATION,
        process_count=1,
    )
    for i in range(GPUS)
)


def report(sequence: int, clock: SystemClock) -> CycleReport:
    """An 8-GPU cycle, every GPU capped at 350 W, finished now."""
    wall, mono = clock.wall(), clock.monotonic()
    return CycleReport(
        sequence=sequence,
        started_wall=wall - 0.001,
        finished_wall=wall,
        started_monotonic=mono - 0.001,
        finished_monotonic=mono,
        gpus=RESULTS,
    )


def publication(hub: Hub, clock: SystemClock, max_subscribers: int) -> Publication:
    """What capwatch's Watch serves from ``hub``, as the agent command builds it."""
    return Publication(
        hub=hub,
        clock=clock,
        node_name="bench-node",
        interval_s=INTERVAL_S,
        namer=settings_for().device_namer(),
        pool_name="bench-node",
        max_subscribers=max_subscribers,
    )


def cycle_message() -> pb.WatchResponse:
    """A cycle message exactly as Watch maps one of the bench's reports (the bytes every
    floor sends)."""
    clock = SystemClock()
    hub = Hub(clock=clock, stale_after_s=3 * INTERVAL_S)
    pub = publication(hub, clock, 1)
    cycle = report(1, clock)
    hub.publish(cycle)
    view = pub.view()
    return pb.WatchResponse(
        cycle=mapping.cycle(
            cycle,
            devices=view.state.devices,
            namer=pub.namer,
            ready=view.readiness,
            age_s=view.now_monotonic - cycle.finished_monotonic,
        )
    )


class TimedHub(Hub):
    """A hub that notes when each report becomes visible to readers, before they are woken."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.recorded_at: list[float] = []

    def _record(self, report: CycleReport) -> list[asyncio.AbstractEventLoop]:
        loops = super()._record(report)
        self.recorded_at.append(time.perf_counter())
        return loops


class FullCollections:
    """When the cyclic collector's full (generation 2) passes began in this process, and
    how long each held the event loop: the source of the fan-out's worst cycles."""

    def __init__(self) -> None:
        self._began = 0.0
        self.passes: list[tuple[float, float]] = []  # (monotonic start, seconds)
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._began = time.monotonic()
        else:
            self.passes.append((self._began, time.monotonic() - self._began))

    def take(self) -> list[tuple[float, float]]:
        taken, self.passes = self.passes, []
        return taken


class ServerSide:
    """Lives in a server process: one server, and what drives it."""

    def __init__(self) -> None:
        self.collections = FullCollections()
        self.published_at: list[float] = []  # the last publish command's cycles, monotonic
        self.clock = SystemClock()
        self.server: AgentServer | None = None
        self.bare: BareWatch | None = None
        self.hub: Hub | None = None
        self.pub: Publication | None = None
        self.agent_loop: AgentLoop | None = None
        self.sequence = 0
        self.flooding: asyncio.Task[None] | None = None
        self.tmp = tempfile.TemporaryDirectory(prefix="capwatch-bench-")
        self.publish_s = 0.0  # mean cost of building and publishing one report
        self.encode_s = 0.0  # and of the Watch feed's encoding it, once for every stream

    async def start(self, kind: str) -> str:
        """Start capwatch's server over a "hub" the bench publishes into, a "replay" hub
        holding REPLAY cycles published beforehand, or the real "agent" loop; or a
        bare grpc.aio one, "bare-loop" or "bare-broadcast"."""
        if kind.startswith("bare"):
            self.bare = BareWatch(cycle_message())
            return await self.bare.start(forever=kind == "bare-loop")
        self.hub = TimedHub(
            clock=self.clock,
            stale_after_s=3 * INTERVAL_S,
            capacity=REPLAY if kind == "replay" else CAPACITY,
            devices=inventory(
                dict(enumerate(AGENT_UUIDS if kind == "agent" else UUIDS)),
                wall=self.clock.wall(),
            ),
        )
        if kind == "agent":
            self.agent_loop = self._agent_loop(self.hub)
        if kind == "replay":
            started = time.perf_counter()
            for _ in range(REPLAY):
                self._publish()
            self.publish_s = (time.perf_counter() - started) / REPLAY
        settings = settings_for("127.0.0.1:0")
        self.pub = publication(self.hub, self.clock, settings.max_subscribers)
        server = AgentServer(settings=settings, publication=self.pub)
        started = time.perf_counter()
        await server.start()
        settle_heap()  # as the agent command does once it serves
        # The Watch feed's task runs first and encodes every cycle already in the
        # hub in one go (its first step does not await).
        await asyncio.sleep(0)
        if kind == "replay":
            self.encode_s = (time.perf_counter() - started) / REPLAY
        self.server = server
        return server.addresses[0]

    def _agent_loop(self, hub: Hub) -> AgentLoop:
        # The benches' node (8 GPUs, 110 pods, 64 processes), pods in memory, no claims:
        # what a cycle costs the streams does not depend on where caps come from.
        root = Path(self.tmp.name)
        world = build_world(root / "proc")
        return AgentLoop(
            reconciler=reconciler_for(
                world, memory_pods(), NoClaims(), root / "proc", root / "state"
            ),
            hub=hub,
            clock=self.clock,
            interval_s=INTERVAL_S,
            cycle_thread=CycleThread(),
        )

    def _publish(self) -> None:
        if self.bare is not None:
            self.bare.publish()
            return
        assert self.hub is not None
        self.sequence += 1
        self.hub.publish(report(self.sequence, self.clock))

    @property
    def sent(self) -> int:
        if self.pub is not None:
            return self.pub.messages_sent
        return self.bare.sent if self.bare is not None else 0

    @property
    def subscribers(self) -> int:
        if self.pub is not None:
            return self.pub.subscribers
        return self.bare.streams if self.bare is not None else 0

    async def publish(self, count: int, interval_s: float) -> list[float]:
        """Publish ``count`` cycles, one every ``interval_s`` on an absolute schedule.

        Returns, per cycle, the seconds until every subscriber's message had
        been handed to grpc (polled each millisecond, at most the interval).
        """
        start = time.monotonic()
        hand_off = []
        self.published_at = []
        for i in range(count):
            await asyncio.sleep(max(0.0, start + i * interval_s - time.monotonic()))
            target = self.sent + self.subscribers
            published = time.monotonic()
            self.published_at.append(published)
            self._publish()
            while self.sent < target and time.monotonic() - published < interval_s:  # noqa: ASYNC110
                await asyncio.sleep(0.001)  # polling is the measurement
            hand_off.append(time.monotonic() - published)
        return hand_off

    async def flood_start(self) -> None:
        self.flooding = asyncio.create_task(self._flood())

    async def flood_stop(self) -> None:
        assert self.flooding is not None
        self.flooding.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.flooding

    async def _flood(self) -> None:
        # Keep 64-128 cycles ahead of what the stream has sent: it never waits
        # for a cycle, and never falls behind the ring (which would resync it).
        assert self.pub is not None
        while self.pub.subscribers < 1 or self.pub.messages_sent < 1:  # noqa: ASYNC110
            await asyncio.sleep(0.001)  # the client connects once, within a second
        sent_before, published = self.pub.messages_sent, 0
        while True:
            if published - (self.pub.messages_sent - sent_before) < 64:
                for _ in range(64):
                    self._publish()
                published += 64
            await asyncio.sleep(0.0005)

    async def cycles(self, count: int, interval_s: float) -> dict[str, list[float]]:
        """Real cycles, in seconds from submit (on the event loop) until: the reconcile
        ended ("reconcile", the report's own duration added to its start), the report
        was in the hub for readers to see ("published"), the cycle thread had woken the
        readers ("woken"), and the event loop had the report back ("returned")."""
        assert self.agent_loop is not None
        assert isinstance(self.hub, TimedHub)
        hub, publish = self.hub, self.hub.publish
        woken_at: list[float] = []

        def timed(report: CycleReport) -> None:
            publish(report)
            woken_at.append(time.perf_counter())

        hub.publish = timed  # type: ignore[method-assign]
        figures: dict[str, list[float]] = {
            "reconcile": [],
            "published": [],
            "woken": [],
            "returned": [],
        }
        try:
            for _ in range(count):
                start, start_mono = time.perf_counter(), self.clock.monotonic()
                report = await self.agent_loop.cycle_once()
                figures["returned"].append(time.perf_counter() - start)
                figures["reconcile"].append(report.finished_monotonic - start_mono)
                figures["published"].append(hub.recorded_at[-1] - start)
                figures["woken"].append(woken_at[-1] - start)
                assert report.enforced, report.failure_summary
                await asyncio.sleep(interval_s)
        finally:
            hub.publish = publish  # type: ignore[method-assign]
        return figures

    async def usage(self) -> dict[str, float]:
        """CPU seconds, the monotonic time and messages sent: no collection first, so a
        window between two calls holds only what the server did in it."""
        return {
            "cpu_s": time.process_time(),
            "at": time.monotonic(),
            "messages_sent": self.sent,
            "publish_s": self.publish_s,
            "encode_s": self.encode_s,
        }

    async def full_collections(self, interval_s: float) -> dict[str, list[float]]:
        """The full collections since the last call: their pauses (seconds), and the
        cycles of the last publish command (by index) during which one began."""
        passes = self.collections.take()
        if not self.published_at:
            return {"pauses": [seconds for _, seconds in passes], "cycles": []}
        ends = [*self.published_at[1:], self.published_at[-1] + interval_s]
        hit = [
            i
            for i, (begin, end) in enumerate(zip(self.published_at, ends, strict=True))
            if any(begin <= at < end for at, _ in passes)
        ]
        return {"pauses": [seconds for _, seconds in passes], "cycles": [float(i) for i in hit]}

    async def stats(self) -> dict[str, float]:
        gc.collect()
        await asyncio.sleep(0.2)  # let closed streams finish unwinding
        gc.collect()
        return {
            "subscribers": self.subscribers,
            "messages_sent": self.sent,
            "rss_kib": status_kib("self"),
            "cpu_s": time.process_time(),
            "publish_s": self.publish_s,
        }

    async def stop(self) -> None:
        if self.flooding is not None:
            self.flooding.cancel()
        if self.server is not None:
            await self.server.stop()
        if self.bare is not None:
            await self.bare.stop()
        self.tmp.cleanup()
