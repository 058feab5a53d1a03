"""The sim DRA driver's kubelet plugin (server.grpc.sim_driver) on real unix sockets, with
a real gRPC client playing the kubelet: registration, prepare and unprepare, the health
mirror on the plugin's endpoint, the slice's publishing and the ordered stop."""

from __future__ import annotations

import asyncio
import socket
import stat
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio

from capwatch.agent.dra.simdriver import DRIVER, SimDevice
from capwatch.api.gen.k8s.io.kubelet.pkg.apis.dra.v1 import dra_plugin_pb2 as dra_pb
from capwatch.api.gen.k8s.io.kubelet.pkg.apis.dra.v1 import dra_plugin_pb2_grpc as dra_grpc
from capwatch.api.gen.pluginregistration import registration_pb2 as reg_pb
from capwatch.api.gen.pluginregistration import registration_pb2_grpc as reg_grpc
from capwatch.api.gen.v1 import dra_health_pb2 as v1_pb
from capwatch.api.gen.v1 import dra_health_pb2_grpc as v1_grpc
from capwatch.kit.backoff import Backoff
from capwatch.kit.errors import CapwatchError
from capwatch.server.grpc.sim_driver import SimDriverServer, plugin_socket, registration_socket
from tests.server.harness import NODE, UUIDS, ServerHarness, failed, ok, start_harness

UID = "c1a1c1a1-0000-4000-8000-000000000001"
pytestmark = pytest.mark.asyncio

WAIT_S = 30.0  # a generous bound for what happens at once; never a speed claim


class Claims:
    """The API server's claims by path; a missing one is what an unreachable server says."""

    def __init__(self, objects: Mapping[str, Mapping[str, Any]]) -> None:
        self.objects = dict(objects)

    def get(self, path: str) -> Mapping[str, Any]:
        if path not in self.objects:
            raise CapwatchError(f"GET {path}: ConnectionRefusedError: [Errno 111]")
        return self.objects[path]


@dataclass
class Slices:
    """Records every apply; the first ``failures`` fail as an unreachable server would."""

    failures: int = 0
    applied: list[Mapping[str, Any]] = field(default_factory=list)

    def node_uid(self, node: str) -> str | None:
        return f"uid-of-{node}"

    def apply(self, body: Mapping[str, Any]) -> None:
        if self.failures:
            self.failures -= 1
            raise CapwatchError("apply resourceslices/x: HTTP 503 unavailable")
        self.applied.append(body)


def claim(namespace: str, name: str, *devices: str, uid: str = UID) -> dict[str, Any]:
    results = [
        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device} for device in devices
    ]
    return {
        "metadata": {"namespace": namespace, "name": name, "uid": uid},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def path(namespace: str, name: str) -> str:
    return f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"


@dataclass
class Plugin:
    harness: ServerHarness
    driver: SimDriverServer
    slices: Slices
    kubelet_dir: Path

    def channel(self, socket: Path) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(f"unix://{socket}")

    async def register(self) -> None:
        """What the kubelet does once GetInfo satisfied it."""
        async with self.channel(registration_socket(self.kubelet_dir)) as channel:
            await reg_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
                reg_pb.RegistrationStatus(plugin_registered=True)
            )


@pytest_asyncio.fixture
async def plugin(tmp_path: Path) -> AsyncIterator[Plugin]:
    harness = await start_harness(interval_s=0.5)
    slices = Slices(failures=2)
    claims = Claims({path("ml", "one-gpu"): claim("ml", "one-gpu", "gpu-1")})
    driver = SimDriverServer(
        kubelet_dir=tmp_path,
        node_name=NODE,
        pool=harness.publication.pool_name,
        devices=[
            SimDevice(name=harness.publication.namer(i, uuid), index=i, uuid=uuid)
            for i, uuid in enumerate(UUIDS)
        ],
        nodes=harness.server.nodes,
        claims=claims,
        slices=slices,
        backoff=Backoff(initial_s=0.01, max_s=0.05),
        republish_s=0.05,
    )
    await driver.start()
    try:
        yield Plugin(harness=harness, driver=driver, slices=slices, kubelet_dir=tmp_path)
    finally:
        await driver.stop(0.5)
        await harness.server.stop()


async def test_the_registration_socket_says_what_the_kubelet_needs(plugin: Plugin) -> None:
    """GetInfo: a DRA plugin named sim.capwatch.io, its endpoint the plugin socket, and
    the plugin service with both health versions; both sockets are the owner's alone."""
    registration = registration_socket(plugin.kubelet_dir)
    assert registration == plugin.kubelet_dir / "plugins_registry" / "sim.capwatch.io-reg.sock"
    async with plugin.channel(registration) as channel:
        info = await reg_grpc.RegistrationStub(channel).GetInfo(reg_pb.InfoRequest())
        await reg_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
            reg_pb.RegistrationStatus(plugin_registered=True)
        )
    assert (info.type, info.name) == ("DRAPlugin", "sim.capwatch.io")
    assert info.endpoint == str(plugin_socket(plugin.kubelet_dir))
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ]
    assert plugin.driver.registration.registered is True
    for each in (registration, plugin_socket(plugin.kubelet_dir)):
        assert stat.S_IMODE(each.stat().st_mode) == 0o600


async def test_a_refused_registration_is_remembered_and_logged(
    plugin: Plugin, caplog: pytest.LogCaptureFixture
) -> None:
    """The kubelet's refusal (its error text) is an error line, not silence."""
    async with plugin.channel(registration_socket(plugin.kubelet_dir)) as channel:
        await reg_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
            reg_pb.RegistrationStatus(plugin_registered=False, error="no supported version")
        )
    assert plugin.driver.registration.registered is False
    assert "the kubelet refused the sim driver" in caplog.text
    assert "no supported version" in caplog.text


async def test_prepare_answers_each_claim_on_its_own(plugin: Plugin) -> None:
    """A claim allocated one sim GPU gets that device, no CDI id; a claim whose UID is
    not the one asked for, one the API server cannot give, and a name that is no
    claim's (never sent to the API server) get their reasons; the others are prepared
    all the same."""
    request = dra_pb.NodePrepareResourcesRequest(
        claims=[
            dra_pb.Claim(namespace="ml", name="one-gpu", uid=UID),
            dra_pb.Claim(namespace="ml", name="one-gpu", uid="replaced"),
            dra_pb.Claim(namespace="ml", name="missing", uid="m"),
            dra_pb.Claim(namespace="ml", name="../../../api/v1/secrets", uid="p"),
        ]
    )
    async with plugin.channel(plugin_socket(plugin.kubelet_dir)) as channel:
        answer = await dra_grpc.DRAPluginStub(channel).NodePrepareResources(request)
    good = answer.claims[UID]
    assert good.error == ""
    assert [(d.pool_name, d.device_name, list(d.request_names)) for d in good.devices] == [
        (NODE, "gpu-1", ["gpu"])
    ]
    assert list(good.devices[0].cdi_device_ids) == []
    assert not good.devices[0].HasField("share_id")
    assert "has UID" in answer.claims["replaced"].error
    assert "ConnectionRefusedError" in answer.claims["m"].error, answer
    assert "is not a ResourceClaim's namespace/name" in answer.claims["p"].error
    for refused in ("replaced", "m", "p"):
        assert answer.claims[refused].error.startswith("capwatch sim driver: ")


async def test_unprepare_succeeds_for_every_claim(plugin: Plugin) -> None:
    """Preparing changed nothing on the node, so there is nothing to undo."""
    request = dra_pb.NodeUnprepareResourcesRequest(
        claims=[dra_pb.Claim(namespace="ml", name=n, uid=n) for n in ("a", "b")]
    )
    async with plugin.channel(plugin_socket(plugin.kubelet_dir)) as channel:
        answer = await dra_grpc.DRAPluginStub(channel).NodeUnprepareResources(request)
    assert {uid: a.error for uid, a in answer.claims.items()} == {"a": "", "b": ""}


async def test_the_endpoint_streams_the_mirror_with_the_slices_names(plugin: Plugin) -> None:
    """NodeWatchResources on the plugin socket is the agent's mirror: every device under
    the names the slice publishes, a failing GPU UNHEALTHY."""
    plugin.harness.publish([ok(0), failed(1), ok(2)])
    await plugin.register()
    await asyncio.wait_for(plugin.driver.published.wait(), WAIT_S)
    async with plugin.channel(plugin_socket(plugin.kubelet_dir)) as channel:
        call = v1_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            v1_pb.NodeWatchResourcesRequest()
        )
        first = await asyncio.wait_for(call.read(), WAIT_S)
        call.cancel()
    published = [d["name"] for d in plugin.slices.applied[0]["spec"]["devices"]]
    pool = plugin.slices.applied[0]["spec"]["pool"]["name"]
    assert [(d.device.pool_name, d.device.device_name) for d in first.devices] == [
        (pool, name) for name in published
    ]
    assert [d.health for d in first.devices] == [v1_pb.HEALTHY, v1_pb.UNHEALTHY, v1_pb.HEALTHY]


async def test_nothing_is_published_before_the_kubelet_registers_the_plugin(
    plugin: Plugin,
) -> None:
    """Until the kubelet says it registered the plugin no apply is tried (a claim placed
    on these devices would fail to prepare); a refusal does not count."""
    async with plugin.channel(registration_socket(plugin.kubelet_dir)) as channel:
        await reg_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
            reg_pb.RegistrationStatus(plugin_registered=False, error="try again")
        )
    await asyncio.sleep(0.3)  # six republish periods: a publisher would have tried
    assert (plugin.slices.failures, plugin.slices.applied) == (2, [])
    assert not plugin.driver.published.is_set()


async def test_the_slice_is_retried_until_applied_and_then_applied_again(plugin: Plugin) -> None:
    """Two failed applies are retried by the backoff; once applied, the same slice is
    applied again and again (a deleted slice comes back), owned by the Node."""
    await plugin.register()
    await asyncio.wait_for(plugin.driver.published.wait(), WAIT_S)
    for _ in range(int(WAIT_S / 0.05)):
        if len(plugin.slices.applied) >= 3:
            break
        await asyncio.sleep(0.05)
    assert len(plugin.slices.applied) >= 3
    assert all(body == plugin.slices.applied[0] for body in plugin.slices.applied)
    owner = plugin.slices.applied[0]["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"]) == ("Node", f"uid-of-{NODE}")


async def test_stop_leaves_no_socket_and_a_start_replaces_stale_ones(tmp_path: Path) -> None:
    """After stop neither socket is left; sockets a killed agent left behind (bound,
    nobody listening) are replaced by the next start, and the kubelet can ask it."""
    harness = await start_harness(interval_s=0.5)
    stale = []
    for path in (registration_socket(tmp_path), plugin_socket(tmp_path)):
        path.parent.mkdir(parents=True, exist_ok=True)
        left = socket.socket(socket.AF_UNIX)
        left.bind(str(path))
        stale.append(left)
    try:
        driver = SimDriverServer(
            kubelet_dir=tmp_path,
            node_name=NODE,
            pool=NODE,
            devices=[SimDevice(name="gpu-0", index=0, uuid=UUIDS[0])],
            nodes=harness.server.nodes,
            claims=Claims({}),
            slices=Slices(),
        )
        await driver.start()
        async with grpc.aio.insecure_channel(f"unix://{registration_socket(tmp_path)}") as channel:
            info = await reg_grpc.RegistrationStub(channel).GetInfo(reg_pb.InfoRequest())
        assert info.name == DRIVER
        await driver.stop(0.1)
        assert not registration_socket(tmp_path).exists()
        assert not plugin_socket(tmp_path).exists()
    finally:
        for left in stale:
            left.close()
        await harness.server.stop()
