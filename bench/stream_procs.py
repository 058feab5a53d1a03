"""The processes bench/stream.py runs: servers and clients, each spawned on its own.

A :class:`Child` is driven one command at a time over a pipe; in the child,
the command names a coroutine method of a :class:`ServerSide` (a capwatch or a
bare grpc.aio server, and what publishes into it) or a :class:`ClientSide`
(Watch streams over channels of their own), run on that process's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import multiprocessing
import os
import signal
import tempfile
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import grpc

from agent.devices import inventory
from agent.hub import Hub
from agent.pods import PodInfo, PodRef
from agent.reports import CapSource, CycleReport, GpuResult, Outcome, Reason
from agent.running import AgentLoop, CycleThread
from api.gen.capwatch.v1 import node_health_pb2 as pb
from bench.stream_clients import ClientSide
from kit.clock import SystemClock
from kit.heap import settle_heap
from server.grpc import mapping
from server.grpc.publication import Publication
from server.grpc.serving import AgentServer
from server.listeners import OPTIONS
from tests.server.harness import settings_for

GPUS = 8
CAPACITY = 256  # the hub's default ring
# Throughput replays cycles published beforehand: a ring this long outlasts a
# round (0.5 s warm-up, 3 s measured) at up to 25,000 messages/s.
REPLAY = 100_000
INTERVAL_S = 15.0  # the agent's default: no heartbeat fires during a measurement
UUIDS = tuple(f"GPU-5e5e5e5e-0000-4000-8000-{i:012d}" for i in range(GPUS))
AGENT_UUIDS = tuple(f"GPU-bbbbbbbb-0000-4000-8000-{i:012d}" for i in range(GPUS))  # cycle.py's
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


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


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
        self.server: grpc.aio.Server | AgentServer | None = None
        self.hub: Hub | None = None
        self.pub: Publication | None = None
        self.agent_loop: AgentLoop | None = None
        self.sequence = 0
        self.flooding: asyncio.Task[None] | None = None
        # The bare server's state: the message it sends, and who waits for it.
        self.bare_message = pb.WatchResponse()
        self.bare_payload = b""
        self.bare_event: asyncio.Event | None = None
        self.bare_sent = self.bare_streams = 0
        self.tmp = tempfile.TemporaryDirectory(prefix="capwatch-bench-")
        self.publish_s = 0.0  # mean cost of building and publishing one report
        self.encode_s = 0.0  # and of the Watch feed's encoding it, once for every stream

    async def start(self, kind: str) -> str:
        """Start capwatch's server over a "hub" the bench publishes into, a "replay" hub
        holding REPLAY cycles published beforehand, or the real "agent" loop; or a
        bare grpc.aio one, "bare-loop" or "bare-broadcast"."""
        if kind.startswith("bare"):
            return await self._start_bare(forever=kind == "bare-loop")
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
        self.pub = self._publication(self.hub, settings.max_subscribers)
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

    def _publication(self, hub: Hub, max_subscribers: int) -> Publication:
        return Publication(
            hub=hub,
            clock=self.clock,
            node_name="bench-node",
            interval_s=INTERVAL_S,
            namer=settings_for().device_namer(),
            pool_name="bench-node",
            max_subscribers=max_subscribers,
        )

    def _agent_loop(self, hub: Hub) -> AgentLoop:
        # bench/cycle.py's node (8 GPUs, 110 pods, 64 processes), pods in memory, no
        # claims: what a cycle costs the streams does not depend on where caps come from.
        from agent.dra.claims import NoClaims
        from bench.cycle import PODS, annotations, build_world, pod_uid, reconciler_for
        from tests.fakes.pods import StaticPodView

        root = Path(self.tmp.name)
        world = build_world(root / "proc")
        pods = StaticPodView(
            PodInfo(
                ref=PodRef(namespace="bench", name=f"p{i}", uid=pod_uid(i)),
                annotations=annotations(i),
            )
            for i in range(PODS)
        )
        return AgentLoop(
            reconciler=reconciler_for(world, pods, NoClaims(), root / "proc", root / "state"),
            hub=hub,
            clock=self.clock,
            interval_s=INTERVAL_S,
            cycle_thread=CycleThread(),
        )

    async def _start_bare(self, *, forever: bool) -> str:
        self.bare_message = self.payload()
        self.bare_payload = self.bare_message.SerializeToString()
        self.bare_event = asyncio.Event()
        opening = pb.WatchResponse(snapshot=pb.NodeSnapshot(node_name="x")).SerializeToString()

        async def watch(request: pb.WatchRequest, context: object) -> Any:
            if forever:  # the same bytes, as fast as grpc takes them
                payload = self.bare_payload
                while True:
                    self.bare_sent += 1
                    yield payload
            # The least a broadcast can do: wait for the next message, send shared bytes.
            self.bare_streams += 1
            try:
                yield opening
                seen = self.sequence
                while True:
                    while self.sequence == seen:
                        assert self.bare_event is not None
                        await self.bare_event.wait()
                    seen = self.sequence
                    self.bare_sent += 1
                    yield self.bare_payload
            finally:
                self.bare_streams -= 1

        handler = grpc.method_handlers_generic_handler(
            "capwatch.v1.NodeHealthService",
            {
                "Watch": grpc.unary_stream_rpc_method_handler(
                    watch, request_deserializer=pb.WatchRequest.FromString
                )
            },
        )
        server = grpc.aio.server(options=OPTIONS)  # capwatch's own server options
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self.server = server
        return f"127.0.0.1:{port}"

    def payload(self) -> pb.WatchResponse:
        """A cycle message exactly as Watch maps one of the bench's reports."""
        hub = Hub(clock=self.clock, stale_after_s=3 * INTERVAL_S)
        pub = self._publication(hub, 1)
        report = self._report(1)
        hub.publish(report)
        view = pub.view()
        cycle = mapping.cycle(
            report,
            devices=view.state.devices,
            namer=pub.namer,
            ready=view.readiness,
            age_s=view.now_monotonic - report.finished_monotonic,
        )
        return pb.WatchResponse(cycle=cycle)

    def _report(self, sequence: int) -> CycleReport:
        wall, mono = self.clock.wall(), self.clock.monotonic()
        return CycleReport(
            sequence=sequence,
            started_wall=wall - 0.001,
            finished_wall=wall,
            started_monotonic=mono - 0.001,
            finished_monotonic=mono,
            gpus=RESULTS,
        )

    def _publish(self) -> None:
        self.sequence += 1
        if self.hub is not None:
            self.hub.publish(self._report(self.sequence))
            return
        # Bare: one new message, serialized once, the same bytes for every stream.
        assert self.bare_event is not None
        self.bare_message.cycle.sequence = self.sequence
        self.bare_message.cycle.finished.FromNanoseconds(time.time_ns())
        self.bare_payload = self.bare_message.SerializeToString()
        self.bare_event.set()
        self.bare_event = asyncio.Event()

    @property
    def sent(self) -> int:
        return self.bare_sent if self.pub is None else self.pub.messages_sent

    @property
    def subscribers(self) -> int:
        return self.bare_streams if self.pub is None else self.pub.subscribers

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
            "rss_kib": rss_kib(),
            "cpu_s": time.process_time(),
            "publish_s": self.publish_s,
        }

    async def stop(self) -> None:
        if self.flooding is not None:
            self.flooding.cancel()
        if isinstance(self.server, AgentServer):
            await self.server.stop()
        elif self.server is not None:
            await self.server.stop(0.5)
        self.tmp.cleanup()


async def _serve(conn: Connection, side: ServerSide | ClientSide) -> None:
    loop = asyncio.get_running_loop()
    while True:
        try:
            command, *args = await loop.run_in_executor(None, conn.recv)
        except EOFError:  # the parent went away
            command, args = "stop", []
        try:
            conn.send(("ok", await getattr(side, command)(*args)))
        except Exception:  # noqa: BLE001 - handed to the parent, which raises it
            with contextlib.suppress(OSError):
                conn.send(("error", traceback.format_exc()))
        if command == "stop":
            return


def child_main(conn: Connection, role: str) -> None:
    asyncio.run(_serve(conn, ServerSide() if role == "server" else ClientSide()))


class Child:
    """A spawned server or client process, driven one command at a time."""

    def __init__(self, role: str, name: str) -> None:
        context = multiprocessing.get_context("spawn")  # grpc does not survive a fork
        self.conn, theirs = context.Pipe()
        self.name = name
        self.process = context.Process(
            target=child_main, args=(theirs, role), name=name, daemon=True
        )
        self.process.start()
        theirs.close()

    def send(self, command: str, *args: object) -> None:
        self.conn.send((command, *args))

    def result(self, command: str, timeout_s: float = 60.0) -> Any:
        if not self.conn.poll(timeout_s):
            raise TimeoutError(f"{self.name}: {command} took over {timeout_s:g}s")
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"{self.name}: {command} failed:\n{value}")
        return value

    def call(self, command: str, *args: object, timeout_s: float = 60.0) -> Any:
        self.send(command, *args)
        return self.result(command, timeout_s)

    def freeze(self, frozen: bool) -> None:
        """SIGSTOP or SIGCONT: a frozen client reads nothing, not even at the TCP level."""
        os.kill(self.process.pid, signal.SIGSTOP if frozen else signal.SIGCONT)

    def close(self) -> None:
        """Stop it cleanly if it answers within 10 s; kill it otherwise."""
        with contextlib.suppress(OSError):
            self.freeze(False)
        with contextlib.suppress(Exception):
            self.call("stop", timeout_s=10)
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
