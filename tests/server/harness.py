"""A real gRPC server on 127.0.0.1:0 over a hub that tests publish into directly.

Tests decide exactly which cycles exist (``publish``), so stream semantics can
be asserted message by message; the real reconcile loop is not involved.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from capwatch.agent.devices import inventory
from capwatch.agent.gpus import GpuErrorClass
from capwatch.agent.health.telemetry import DeviceEvent
from capwatch.agent.hub import Hub
from capwatch.agent.pods import PodRef
from capwatch.agent.reports import (
    AbortReason,
    CapSource,
    CycleFailure,
    CycleFailureKind,
    CycleReport,
    GpuResult,
    Outcome,
    Reason,
)
from capwatch.kit.clock import Clock, SystemClock
from capwatch.server.grpc.publication import Publication
from capwatch.server.grpc.serving import AgentServer
from capwatch.server.settings import ServerSettings, server_settings

NODE = "node-under-test"
UUIDS = tuple(f"GPU-5e5e5e5e-0000-4000-8000-{i:012d}" for i in range(3))
POD = PodRef(namespace="ml", name="trainer", uid="aaaaaaaa-0000-4000-8000-000000000001")


def ok(index: int, watts: int = 350) -> GpuResult:
    return GpuResult(
        index=index,
        uuid=UUIDS[index],
        outcome=Outcome.ENFORCED,
        reason=Reason.OK,
        message=f"capped at {watts} W (annotation)",
        owners=(POD,),
        requested_watts=watts,
        resolved_watts=watts,
        applied_watts=watts,
        cap_source=CapSource.ANNOTATION,
        process_count=1,
    )


def idle(index: int) -> GpuResult:
    return GpuResult(
        index=index, uuid=UUIDS[index], outcome=Outcome.IDLE, reason=Reason.IDLE, message="idle"
    )


def failed(index: int, error: GpuErrorClass = GpuErrorClass.NO_PERMISSION) -> GpuResult:
    return GpuResult(
        index=index,
        uuid=UUIDS[index],
        outcome=Outcome.FAILED,
        reason=Reason.WRITE_FAILED,
        message=f"cap write failed: {error.value}",
        error_class=error,
        owners=(POD,),
        requested_watts=350,
        resolved_watts=350,
        cap_source=CapSource.ANNOTATION,
        process_count=1,
    )


@dataclass
class ServerHarness:
    hub: Hub
    publication: Publication
    server: AgentServer
    clock: Clock = field(default_factory=SystemClock)
    sequence: int = 0

    @property
    def target(self) -> str:
        return next(a for a in self.server.addresses if not a.startswith("unix:"))

    def channel(self, **options: object) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(self.target)

    def publish(
        self,
        gpus: Sequence[GpuResult] | None = None,
        *,
        abort: AbortReason | None = None,
        failures: Sequence[CycleFailure] = (),
        events: Sequence[DeviceEvent] = (),
    ) -> CycleReport:
        """Publish the next cycle (default: every GPU enforced)."""
        self.sequence += 1
        now_wall, now_mono = self.clock.wall(), self.clock.monotonic()
        report = CycleReport(
            sequence=self.sequence,
            started_wall=now_wall - 0.001,
            finished_wall=now_wall,
            started_monotonic=now_mono - 0.001,
            finished_monotonic=now_mono,
            gpus=tuple(gpus if gpus is not None else [ok(i) for i in range(len(UUIDS))])
            if abort is None
            else (),
            failures=tuple(failures)
            or (
                (CycleFailure(kind=CycleFailureKind.POD_VIEW_NOT_SYNCED, message="x"),)
                if abort is AbortReason.POD_VIEW_NOT_SYNCED
                else ()
            ),
            abort_reason=abort,
            events=tuple(events),
        )
        self.hub.publish(report)
        return report


def settings_for(*listen: str, extra: dict[str, object] | None = None) -> ServerSettings:
    values: dict[str, object] = {
        "grpc_listen": list(listen) or ["127.0.0.1:0"],
        "grpc_grace": "0.5",
    }
    values.update(extra or {})
    return server_settings(argparse.Namespace(**values), {})


async def start_harness(
    *,
    interval_s: float = 0.5,
    settings: ServerSettings | None = None,
    capacity: int = 16,
    tmp_path: Path | None = None,
    clock: Clock | None = None,
) -> ServerHarness:
    """A hub, its publication and a started AgentServer on them; ``clock`` (the system
    clock unless given) dates the published cycles and decides readiness."""
    clock = clock or SystemClock()
    hub = Hub(
        clock=clock,
        stale_after_s=3 * interval_s,
        capacity=capacity,
        devices=inventory(dict(enumerate(UUIDS)), wall=clock.wall()),
    )
    settings = settings or settings_for()
    publication = Publication(
        hub=hub,
        clock=clock,
        node_name=NODE,
        interval_s=interval_s,
        namer=settings.device_namer(),
        pool_name=settings.dra_pool_name or NODE,
        max_subscribers=settings.max_subscribers,
        reserved_local=settings.reserved_local_subscribers,
        max_per_peer=settings.max_streams_per_peer,
    )
    server = AgentServer(settings=settings, publication=publication)
    await server.start()
    return ServerHarness(hub=hub, publication=publication, server=server, clock=clock)


def released(index: int) -> GpuResult:
    """The owner left and the default limit was restored (a healthy outcome)."""
    return GpuResult(
        index=index,
        uuid=UUIDS[index],
        outcome=Outcome.RELEASED,
        reason=Reason.RELEASED,
        message="default limit restored",
    )


async def restart_harness(old: ServerHarness, *, same_instance: bool) -> ServerHarness:
    """Stop ``old``'s server (unless stopped) and serve again on its port: an agent restart.

    ``same_instance``: the new hub keeps the agent instance id and every
    buffered cycle, so sequences continue (as if only the gRPC server had
    restarted); otherwise it is a new agent instance whose sequences restart.
    """
    if not old.publication.stopping.is_set():
        await old.server.stop()
    new = await start_harness(
        interval_s=old.publication.interval_s, settings=settings_for(old.target)
    )
    if same_instance:
        new.hub.instance_id = old.hub.instance_id
        for report in old.hub.since(0) or ():
            new.hub.publish(report)
        new.sequence = old.sequence
    return new


@contextlib.asynccontextmanager
async def running(
    *,
    interval_s: float = 0.5,
    settings: ServerSettings | None = None,
    capacity: int = 16,
    clock: Clock | None = None,
) -> AsyncIterator[ServerHarness]:
    """A harness for one ``async with`` block (own settings), stopped when it ends."""
    started = await start_harness(
        interval_s=interval_s, settings=settings, capacity=capacity, clock=clock
    )
    try:
        yield started
    finally:
        await started.server.stop()


async def eventually(
    condition: Callable[[], Awaitable[bool]], *, timeout: float = 2.0, step: float = 0.01
) -> None:
    """Poll ``condition`` until it holds; fail with AssertionError after ``timeout``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(step)


async def next_event(stream: Any, kind: str, *, timeout: float = 2.0) -> Any:
    """Read a capwatch.v1 Watch stream until a message whose event is ``kind``; return it."""
    async with asyncio.timeout(timeout):
        while True:
            message = await stream.read()
            if message is grpc.aio.EOF:
                raise AssertionError(f"stream ended before a {kind} arrived")
            if message.WhichOneof("event") == kind:
                return getattr(message, kind)
