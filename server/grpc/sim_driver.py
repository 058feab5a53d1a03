"""The sim DRA driver as the kubelet sees it: a registered kubelet plugin that prepares
claims and serves the DRA health mirror (agent.dra.simdriver says what it is).

One grpc server on two unix sockets under the kubelet's directory:

- ``plugins_registry/sim.capwatch.io-reg.sock``: plugin registration (GetInfo,
  NotifyRegistrationStatus). The kubelet watches that directory, asks what the plugin
  is, and registers it; removing the socket unregisters it.
- ``plugins/sim.capwatch.io/dra.sock``: the endpoint GetInfo names. The kubelet calls
  NodePrepareResources / NodeUnprepareResources here and opens NodeWatchResources
  (v1, else v1alpha1) for the health of the devices it prepared, which is the agent's
  mirror (server.grpc.dra) unchanged.

The node's ResourceSlice is applied once the kubelet has registered the plugin (the
scheduler places no claim on a device whose driver the kubelet cannot find yet) and
again every :data:`REPUBLISH_S` (a slice someone deleted is back within that; a failed
apply is retried by the shared backoff). At stop the registration socket goes first, so the
kubelet unregisters the plugin and ends its stream before the server stops; the
slice is left for the next agent (the kubelet deletes it if none registers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import grpc

from capwatch.agent.dra.simdriver import (
    DRIVER,
    PreparedDevice,
    SimDevice,
    prepared_devices,
    resource_slice,
)
from capwatch.agent.kube.claims import claim_path
from capwatch.api.gen.k8s.io.kubelet.pkg.apis.dra.v1 import dra_plugin_pb2 as dra_pb
from capwatch.api.gen.k8s.io.kubelet.pkg.apis.dra.v1 import dra_plugin_pb2_grpc as dra_grpc
from capwatch.api.gen.pluginregistration import registration_pb2 as reg_pb
from capwatch.api.gen.pluginregistration import registration_pb2_grpc as reg_grpc
from capwatch.api.gen.v1 import dra_health_pb2_grpc as v1_grpc
from capwatch.api.gen.v1alpha1 import dra_health_pb2_grpc as v1alpha1_grpc
from capwatch.kit.backoff import Backoff
from capwatch.kit.errors import CapwatchError
from capwatch.kit.names import is_dns_label, is_dns_subdomain
from capwatch.kit.supervision import ended
from capwatch.server.grpc.dra import DraV1alpha1Servicer, DraV1Servicer
from capwatch.server.grpc.nodes import NodeDirectory
from capwatch.server.listeners import OPTIONS, bind_unix

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
# What the kubelet may call on the endpoint, newest first: the plugin service and the
# health service in both versions the kubelet reads (1.37 prefers v1).
SUPPORTED_SERVICES = ("v1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
REPUBLISH_S = 60.0
PUBLISH_BACKOFF = Backoff(initial_s=1.0, max_s=30.0)


class ClaimReader(Protocol):
    def get(self, path: str) -> Mapping[str, Any]:
        """The object at ``path``; raises CapwatchError when it cannot be read."""
        ...


class SlicePublishing(Protocol):
    def node_uid(self, node: str) -> str | None: ...

    def apply(self, body: Mapping[str, Any]) -> None:
        """Create or update the slice; raises CapwatchError."""
        ...


def registration_socket(kubelet_dir: Path) -> Path:
    return kubelet_dir / "plugins_registry" / f"{DRIVER}-reg.sock"


def plugin_socket(kubelet_dir: Path) -> Path:
    return kubelet_dir / "plugins" / DRIVER / "dra.sock"


class RegistrationServicer(reg_grpc.RegistrationServicer):
    """What the kubelet's plugin watcher asks; its verdict is logged (one line)."""

    def __init__(self, endpoint: Path) -> None:
        self._endpoint = endpoint
        self.registered: bool | None = None  # the kubelet's last word
        self.accepted = asyncio.Event()  # the kubelet registered the plugin, once

    async def GetInfo(
        self, request: reg_pb.InfoRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> reg_pb.PluginInfo:
        return reg_pb.PluginInfo(
            type=PLUGIN_TYPE,
            name=DRIVER,
            endpoint=str(self._endpoint),
            supported_versions=SUPPORTED_SERVICES,
        )

    async def NotifyRegistrationStatus(
        self, request: reg_pb.RegistrationStatus, context: grpc.aio.ServicerContext[Any, Any]
    ) -> reg_pb.RegistrationStatusResponse:
        self.registered = request.plugin_registered
        if request.plugin_registered:
            log.info("sim driver registered with the kubelet driver=%s", DRIVER)
            self.accepted.set()
        else:
            log.error("the kubelet refused the sim driver driver=%s: %s", DRIVER, request.error)
        return reg_pb.RegistrationStatusResponse()


class DraPluginServicer(dra_grpc.DRAPluginServicer):
    """Prepare: the claim's devices of this driver, read from the API server; unprepare:
    nothing to undo. A claim that cannot be prepared gets its reason, the rest go on."""

    def __init__(self, *, claims: ClaimReader, pool: str, devices: Sequence[str]) -> None:
        self._claims = claims
        self._pool = pool
        self._devices = tuple(devices)

    async def NodePrepareResources(
        self,
        request: dra_pb.NodePrepareResourcesRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> dra_pb.NodePrepareResourcesResponse:
        answers = {}
        for claim in request.claims:
            answers[claim.uid] = await self._prepare(claim)
        return dra_pb.NodePrepareResourcesResponse(claims=answers)

    async def _prepare(self, claim: dra_pb.Claim) -> dra_pb.NodePrepareResourceResponse:
        where = f"{claim.namespace}/{claim.name}"
        if not (is_dns_label(claim.namespace) and is_dns_subdomain(claim.name)):
            # Never a path of the request's making on the API server.
            log.warning("refused to prepare claim=%r: not a claim's namespace and name", where)
            return dra_pb.NodePrepareResourceResponse(
                error=f"capwatch sim driver: {where!r} is not a ResourceClaim's namespace/name"
            )
        try:
            found = await asyncio.to_thread(
                self._claims.get, claim_path(claim.namespace, claim.name)
            )
            devices = prepared_devices(found, uid=claim.uid, pool=self._pool, devices=self._devices)
        except CapwatchError as err:  # PrepareError among them
            log.warning("cannot prepare claim=%s uid=%s: %s", where, claim.uid, err)
            return dra_pb.NodePrepareResourceResponse(error=f"capwatch sim driver: {err}")
        log.info(
            "prepared claim=%s uid=%s devices=%s",
            where,
            claim.uid,
            ",".join(d.device for d in devices) or "-",
        )
        return dra_pb.NodePrepareResourceResponse(devices=[_device(d) for d in devices])

    async def NodeUnprepareResources(
        self,
        request: dra_pb.NodeUnprepareResourcesRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> dra_pb.NodeUnprepareResourcesResponse:
        for claim in request.claims:
            log.info("unprepared claim=%s/%s uid=%s", claim.namespace, claim.name, claim.uid)
        return dra_pb.NodeUnprepareResourcesResponse(
            claims={c.uid: dra_pb.NodeUnprepareResourceResponse() for c in request.claims}
        )


def _device(device: PreparedDevice) -> dra_pb.Device:
    found = dra_pb.Device(
        request_names=device.requests, pool_name=device.pool, device_name=device.device
    )
    if device.share_id is not None:
        found.share_id = device.share_id
    return found


class SimDriverServer:
    """The plugin's sockets, its servicers and the slice's publishing, started and
    stopped in order."""

    def __init__(
        self,
        *,
        kubelet_dir: Path,
        node_name: str,
        pool: str,
        devices: Sequence[SimDevice],
        nodes: NodeDirectory,
        claims: ClaimReader,
        slices: SlicePublishing,
        on_fatal: Callable[[], None] = lambda: None,
        rng: random.Random | None = None,
        backoff: Backoff = PUBLISH_BACKOFF,
        republish_s: float = REPUBLISH_S,
    ) -> None:
        self._registration_path = registration_socket(kubelet_dir)
        self._plugin_path = plugin_socket(kubelet_dir)
        self._node = node_name
        self._pool = pool
        self._devices = tuple(devices)
        self._slices = slices
        self._on_fatal = on_fatal
        self._rng = rng or random.Random()
        self._backoff = backoff
        self._republish_s = republish_s
        self._stopping = False
        self._publisher: asyncio.Task[None] | None = None
        self.published = asyncio.Event()  # the slice applied at least once
        self.registration = RegistrationServicer(self._plugin_path)
        self._server = grpc.aio.server(options=OPTIONS)
        reg_grpc.add_RegistrationServicer_to_server(self.registration, self._server)
        dra_grpc.add_DRAPluginServicer_to_server(
            DraPluginServicer(claims=claims, pool=pool, devices=[d.name for d in devices]),
            self._server,
        )
        v1_grpc.add_DRAResourceHealthServicer_to_server(DraV1Servicer(nodes), self._server)
        v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(
            DraV1alpha1Servicer(nodes), self._server
        )
        self._sockets: list[Path] = []

    async def start(self) -> None:
        """Serve both sockets; the slice is published (in the background, retried) once
        the kubelet has registered the plugin: the scheduler sees the devices only when
        the kubelet can find the driver that prepares them. Raises
        server.listeners.ServeError."""
        try:
            self._bind(self._plugin_path)
            self._bind(self._registration_path)
        except BaseException:
            self._remove_sockets()
            raise
        await self._server.start()
        log.info(
            "sim DRA driver serving driver=%s registration=%s endpoint=%s devices=%d",
            DRIVER,
            self._registration_path,
            self._plugin_path,
            len(self._devices),
        )
        self._publisher = asyncio.create_task(self._publish(), name="capwatch-sim-slice")
        self._publisher.add_done_callback(self._supervise)

    async def stop(self, grace_s: float) -> None:
        """Unregister (the registration socket goes), end the streams, stop the server."""
        self._stopping = True
        with contextlib.suppress(FileNotFoundError):
            self._registration_path.unlink()
        await self._server.stop(grace_s)
        if self._publisher is not None:
            self._publisher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._publisher
        self._remove_sockets()
        log.info("sim DRA driver stopped")

    async def _publish(self) -> None:
        if not self.registration.accepted.is_set():
            log.info("sim driver slice waits for the kubelet to register the plugin")
            await self.registration.accepted.wait()
        node_uid = await asyncio.to_thread(self._slices.node_uid, self._node)
        body = resource_slice(
            node=self._node, node_uid=node_uid, pool=self._pool, devices=self._devices
        )
        failures = 0
        while True:
            try:
                await asyncio.to_thread(self._slices.apply, body)
            except CapwatchError as err:
                wait = self._backoff.delay(failures, self._rng)
                failures += 1
                log.warning("sim driver slice not published (retry in %.1fs): %s", wait, err)
                await asyncio.sleep(wait)
                continue
            if failures or not self.published.is_set():
                log.info("sim driver slice published name=%s", body["metadata"]["name"])
            failures = 0
            self.published.set()
            await asyncio.sleep(self._republish_s)

    def _bind(self, path: Path) -> None:
        # 0600: the kubelet (root) is the only client.
        bind_unix(self._server.add_insecure_port, path, umask=0o177)
        self._sockets.append(path)

    def _remove_sockets(self) -> None:
        for path in self._sockets:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self._sockets.clear()

    def _supervise(self, task: asyncio.Task[None]) -> None:
        ended(task, stopping=self._stopping, on_fatal=self._on_fatal, log=log)
