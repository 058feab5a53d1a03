"""Device faults end to end: the fake libnvidia-ml, the real pynvml and NvmlBackend (its
event thread included), the real Reconciler and fault tracker, a real AgentServer, and
three readers: capwatch.v1 GetSnapshot, and both DRA mirrors decoded with the kubelet's
own classes. Each fault kind makes the GPU UNHEALTHY on all three, then recovers. The
agent's clock is a fake one, stepped by the tests: a quiet window ends exactly when it
should, never after a real sleep; only the event thread's deliveries are waited for."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from capwatch.agent.attribution import Attributor, FsProcRoot
from capwatch.agent.health.faults import FaultTracker, XidPolicy
from capwatch.agent.nvml.backend import NvmlBackend
from capwatch.agent.ownership import OwnershipStore
from capwatch.agent.reconciling import Reconciler
from capwatch.agent.reports import CycleReport
from capwatch.agent.stepping import Policy
from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.api.gen.capwatch.v1 import node_health_pb2_grpc as pb_grpc
from capwatch.kit.clock import FakeClock
from tests.dra.client import KubeletStream
from tests.dra.kubelet_api import VERSIONS, KubeletApi
from tests.fakenvml.control import FakeDevice, FakeNvml
from tests.fakes.pods import StaticPodView
from tests.server.harness import UUIDS, ServerHarness, start_harness

pytestmark = [pytest.mark.nvml, pytest.mark.asyncio]

RECOVERY_S = 0.5  # the quiet window (fake clock; binary-exact, so the bound is exact)
STEP_S = 0.25  # a step short of it
DELIVERY_S = 10.0  # a hang guard for what the event thread delivers; never a speed claim
INTERVAL_S = 30.0  # no re-send of the DRA lists between a test's own cycles
FAULTY = 1  # the GPU each test hurts; GPUs 0 and 2 must stay healthy throughout


@dataclass
class Node:
    """One agent over the fake library, its server, and the three readers."""

    fake: FakeNvml
    clock: FakeClock
    reconciler: Reconciler
    harness: ServerHarness
    snapshot: Callable[[], object]
    streams: dict[str, KubeletStream]
    last_report: CycleReport | None = None

    async def cycle(self) -> tuple[pb.DeviceStatus, dict[str, tuple[str, str]]]:
        """Run one cycle, publish it, and read GPU FAULTY on capwatch.v1 and each mirror."""
        report = await asyncio.to_thread(self.reconciler.reconcile_once)
        self.harness.hub.publish(report)
        self.last_report = report
        snapshot = await self.snapshot()  # type: ignore[misc]
        devices = {d.index: d for d in snapshot.snapshot.devices}
        mirrors = {}
        for version, stream in self.streams.items():
            got = await stream.read()
            names = {number: name for name, number in stream.api.health.items()}
            device = got.response.devices[FAULTY]
            others = {names[d.health] for i, d in enumerate(got.response.devices) if i != FAULTY}
            assert others == {"HEALTHY"}, f"{version}: another GPU was touched"
            mirrors[version] = (names[device.health], device.message)
        assert {devices[i].health for i in devices if i != FAULTY} == {pb.DEVICE_HEALTH_HEALTHY}
        return devices[FAULTY], mirrors

    async def until(self, done: Callable[[pb.DeviceStatus], bool]):
        """Cycles until GPU FAULTY's status satisfies ``done`` (events arrive on a thread;
        the clock is not stepped meanwhile)."""
        deadline = time.monotonic() + DELIVERY_S
        while True:
            device, mirrors = await self.cycle()
            if done(device):
                return device, mirrors
            if time.monotonic() > deadline:
                pytest.fail(f"GPU {FAULTY} never reached the expected state; last: {device}")
            await asyncio.sleep(0.02)


@pytest_asyncio.fixture
async def node(
    fake_nvml: FakeNvml, kubelet: dict[str, KubeletApi], tmp_path: Path
) -> AsyncIterator[Node]:
    fake_nvml.configure([FakeDevice(uuid=uuid) for uuid in UUIDS])
    backend = NvmlBackend.open(event_wait_ms=20)
    clock = FakeClock()
    reconciler = Reconciler(
        backend=backend,
        pods=StaticPodView(()),
        attributor=Attributor(FsProcRoot(tmp_path / "proc")),
        store=OwnershipStore(tmp_path / "state", clock=clock),
        clock=clock,
        policy=Policy(annotation_key="capwatch.io/gpu-power-limit", safe_default_watts=300),
        initial_device_count=len(UUIDS),
        faults=FaultTracker(
            policy=XidPolicy(),
            recovery_s=RECOVERY_S,
            wall=clock.wall,
            monotonic=clock.monotonic,
        ),
    )
    harness = await start_harness(interval_s=INTERVAL_S, clock=clock)
    channel = harness.channel()
    stub = pb_grpc.NodeHealthServiceStub(channel)
    streams = {v: KubeletStream(channel, kubelet[v], interval_s=INTERVAL_S) for v in VERSIONS}
    for stream in streams.values():
        await stream.read()  # the list on open
    try:
        yield Node(
            fake=fake_nvml,
            clock=clock,
            reconciler=reconciler,
            harness=harness,
            snapshot=lambda: stub.GetSnapshot(pb.GetSnapshotRequest()),
            streams=streams,
        )
    finally:
        for stream in streams.values():
            stream.cancel()
        await channel.close()
        await harness.server.stop()
        backend.close()


def _kinds(device: pb.DeviceStatus) -> list[str]:
    return [pb.FaultKind.Name(f.kind) for f in device.faults]


async def _healthy_again(node: Node, *, quiet_window: bool = False) -> None:
    """The next cycle finds GPU FAULTY healthy on every reader; with ``quiet_window``, only
    once the window has passed with no new fault: a cycle a step short of it is still
    UNHEALTHY, the first one at it is not."""
    if quiet_window:
        node.clock.advance(RECOVERY_S - STEP_S)
        device, mirrors = await node.cycle()
        assert (device.health, len(device.faults)) == (pb.DEVICE_HEALTH_UNHEALTHY, 1)
        assert {m[0] for m in mirrors.values()} == {"UNHEALTHY"}
        node.clock.advance(STEP_S)
    device, mirrors = await node.cycle()
    assert (device.health, list(device.faults)) == (pb.DEVICE_HEALTH_HEALTHY, [])
    assert {m[0] for m in mirrors.values()} == {"HEALTHY"}
    assert all("device fault" not in m[1] for m in mirrors.values())


async def test_a_fatal_xid_is_unhealthy_everywhere_then_clears(node: Node):
    """XID 79 queued in the library reaches the event thread, then the next cycle: GPU 1 is
    UNHEALTHY with its outcome still idle on capwatch.v1, and on both mirrors with a message
    naming the XID; after the quiet window it is HEALTHY again."""
    await node.cycle()
    node.fake.queue_xid(FAULTY, 79)
    device, mirrors = await node.until(lambda d: bool(d.faults))
    assert (_kinds(device), device.faults[0].code) == (["FAULT_KIND_XID"], 79)
    assert (device.health, device.outcome) == (pb.DEVICE_HEALTH_UNHEALTHY, pb.OUTCOME_IDLE)
    for health, message in mirrors.values():
        assert (health, message) == (
            "UNHEALTHY",
            "capwatch: device fault (XID 79); idle, no power cap required",
        )
    await _healthy_again(node, quiet_window=True)


async def test_an_ignored_xid_stays_healthy_and_is_still_seen(node: Node):
    """XID 13 (an application's own error) is drained and counted but leaves the GPU healthy."""
    await node.cycle()
    node.fake.queue_xid(FAULTY, 13)
    deadline = time.monotonic() + 5
    drained = 0
    while not drained and time.monotonic() < deadline:
        device, mirrors = await node.cycle()  # every reader read after every cycle
        assert node.last_report is not None
        drained = sum(e.count for e in node.last_report.events if e.code == 13)
        await asyncio.sleep(0.02)
    assert drained == 1
    assert (device.health, list(device.faults)) == (pb.DEVICE_HEALTH_HEALTHY, [])
    assert {m[0] for m in mirrors.values()} == {"HEALTHY"}


async def test_a_lost_gpu_is_unhealthy_until_it_answers_with_its_uuid(node: Node):
    """A GPU answering GPU_IS_LOST fails its step and carries gpu_lost; the mirrors say so;
    when the same UUID answers again it is healthy at once (no quiet window)."""
    await node.cycle()
    node.fake.set_lost(FAULTY, True)
    device, mirrors = await node.until(lambda d: bool(d.faults))
    assert _kinds(device) == ["FAULT_KIND_GPU_LOST"]
    assert device.outcome == pb.OUTCOME_FAILED
    for health, message in mirrors.values():
        assert health == "UNHEALTHY"
        assert message.startswith("capwatch: device fault (GPU lost); power cap not enforced")
    node.fake.set_lost(FAULTY, False)
    await _healthy_again(node)


async def test_uncorrectable_ecc_errors_are_unhealthy_then_clear(node: Node):
    """The volatile uncorrected count rising is an ecc_uncorrected fault on every reader;
    it clears after the quiet window without new errors."""
    await node.cycle()  # the first count is the baseline
    node.fake.add_ecc_errors(FAULTY, 2)
    device, mirrors = await node.until(lambda d: bool(d.faults))
    assert _kinds(device) == ["FAULT_KIND_ECC_UNCORRECTED"]
    assert device.telemetry.ecc_uncorrected_volatile == 2
    assert set(mirrors.values()) == {
        (
            "UNHEALTHY",
            "capwatch: device fault (uncorrectable ECC errors); idle, no power cap required",
        )
    }
    await _healthy_again(node, quiet_window=True)


async def test_a_row_remap_failure_lasts_as_long_as_the_device_reports_it(node: Node):
    """A failed row remap is a fault while the read says so, whatever time passes, and
    clears on the first read that says it no longer has."""
    node.fake.set_row_remap(FAULTY, pending=True, failure=True)
    device, mirrors = await node.until(lambda d: bool(d.faults))
    assert _kinds(device) == ["FAULT_KIND_ROW_REMAP_FAILURE"]
    assert device.telemetry.row_remap_pending is True
    assert {m[0] for m in mirrors.values()} == {"UNHEALTHY"}
    node.clock.advance(10 * RECOVERY_S)  # ten quiet windows: the read still says so
    device, _ = await node.cycle()
    assert _kinds(device) == ["FAULT_KIND_ROW_REMAP_FAILURE"]
    node.fake.set_row_remap(FAULTY, pending=False, failure=False)
    await _healthy_again(node)


async def test_reads_the_device_does_not_support_are_not_faults(node: Node):
    """Power draw and ECC answering NOT_SUPPORTED leave those telemetry fields absent, no
    failed read named, and the GPU healthy on every reader."""
    node.fake.inject("nvmlDeviceGetPowerUsage", FAULTY, "NVML_ERROR_NOT_SUPPORTED")
    node.fake.inject("nvmlDeviceGetTotalEccErrors", FAULTY, "NVML_ERROR_NOT_SUPPORTED")
    device, mirrors = await node.cycle()
    assert device.health == pb.DEVICE_HEALTH_HEALTHY
    assert not device.telemetry.HasField("power_draw_milliwatts")
    assert not device.telemetry.HasField("ecc_uncorrected_volatile")
    assert device.telemetry.HasField("enforced_limit_milliwatts")
    assert list(device.telemetry.failed_reads) == []
    assert {m[0] for m in mirrors.values()} == {"HEALTHY"}


async def test_a_gpu_that_errors_on_every_read_is_named_not_faulted(node: Node):
    """Every telemetry read failing with an unknown error is reported as failed reads; the
    GPU's own step still decides its health."""
    for function in (
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
    ):
        node.fake.inject(function, FAULTY, "NVML_ERROR_UNKNOWN")
    device, mirrors = await node.cycle()
    assert set(device.telemetry.failed_reads) == {
        "power_draw",
        "enforced_limit",
        "throttle_reasons",
        "ecc",
        "row_remap",
    }
    assert device.health == pb.DEVICE_HEALTH_HEALTHY
    assert {m[0] for m in mirrors.values()} == {"HEALTHY"}


async def test_a_flood_of_xids_is_one_fault_drained_as_one_entry(node: Node):
    """10,000 XID 79 events reach the tracker as one fault with their count; each cycle
    that drains some gets them as one entry with a count (no per-event work on the
    cycle: what a drain and a cycle cost with a flood is bench/scenarios/events.py's), and the
    other GPUs are untouched."""
    await node.cycle()
    node.fake.queue_xid(FAULTY, 79, count=10_000)
    seen = 0
    entries = []
    deadline = time.monotonic() + 10
    while seen < 10_000 and time.monotonic() < deadline:
        await node.cycle()  # every reader read after every cycle
        assert node.last_report is not None
        events = node.last_report.events
        entries.append([(e.index, e.code) for e in events])
        seen += sum(e.count for e in events)
        await asyncio.sleep(0.05)
    assert seen == 10_000
    assert all(cycle in ([], [(FAULTY, 79)]) for cycle in entries), entries
    device, mirrors = await node.cycle()
    assert [(f.code, f.count) for f in device.faults] == [(79, 10_000)]
    assert {m[0] for m in mirrors.values()} == {"UNHEALTHY"}
