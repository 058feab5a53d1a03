"""The agent's gRPC server: listeners, TLS, limits, services, and ordered shutdown.

Services: capwatch.v1.NodeHealthService, the DRA resource-health mirrors
(v1alpha1 and v1), grpc.health.v1 and server reflection; every method behind
the interceptor that refuses malformed requests (server/malformed.py, shared with
the controller's cluster stream).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from capwatch.api.gen.capwatch.v1 import node_health_pb2
from capwatch.api.gen.v1 import dra_health_pb2 as v1_pb
from capwatch.api.gen.v1 import dra_health_pb2_grpc as v1_grpc
from capwatch.api.gen.v1alpha1 import dra_health_pb2 as v1alpha1_pb
from capwatch.api.gen.v1alpha1 import dra_health_pb2_grpc as v1alpha1_grpc
from capwatch.kit.flags import is_digits
from capwatch.kit.supervision import ended
from capwatch.server.certificates import CertificateError, ReloadingCertificates, Reloads
from capwatch.server.grpc import node_health
from capwatch.server.grpc.dra import DraV1alpha1Servicer, DraV1Servicer
from capwatch.server.grpc.health import SERVICES, ListingHealthServicer, track_readiness
from capwatch.server.grpc.node_health import NodeHealthServicer
from capwatch.server.grpc.nodes import NodeDirectory, OneNode
from capwatch.server.grpc.publication import Publication
from capwatch.server.listeners import OPTIONS, ServeError, address_in_use, bind_unix
from capwatch.server.malformed import MalformedRequests
from capwatch.server.settings import Listener, ServerSettings

log = logging.getLogger(__name__)

SERVICE_NAMES = (
    node_health_pb2.DESCRIPTOR.services_by_name["NodeHealthService"].full_name,
    v1alpha1_pb.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name,
    v1_pb.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name,
    health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
    reflection.SERVICE_NAME,
)


class AgentServer:
    def __init__(
        self,
        *,
        settings: ServerSettings,
        publication: Publication | None = None,
        nodes: NodeDirectory | None = None,
        on_fatal: Callable[[], None] = lambda: None,
    ) -> None:
        """Serve the agent's ``publication``, or the ``nodes`` of a pool (one of the two).
        gRPC health follows the agent's readiness; a pool's is SERVING while it runs."""
        if (publication is None) == (nodes is None):
            raise ValueError("serve one publication or a directory of nodes")
        self._on_fatal = on_fatal  # a supervised task died: the process must stop
        self._settings = settings
        self._pub = publication
        self._nodes: NodeDirectory = nodes or OneNode(publication)  # type: ignore[arg-type]
        self._stopping = False
        self._malformed = MalformedRequests()
        self._server = grpc.aio.server(interceptors=(self._malformed,), options=OPTIONS)
        self._health = ListingHealthServicer()
        self._tracker: asyncio.Task[None] | None = None
        self._feeder: asyncio.Task[None] | None = None
        self._sockets: list[Path] = []
        self._certificates: ReloadingCertificates | None = None
        self.addresses: list[str] = []  # as bound (port 0 resolved)
        self._watch = NodeHealthServicer(self._nodes)
        node_health.add_to_server(self._watch, self._server)
        v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(
            DraV1alpha1Servicer(self._nodes), self._server
        )
        v1_grpc.add_DRAResourceHealthServicer_to_server(DraV1Servicer(self._nodes), self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        reflection.enable_server_reflection(SERVICE_NAMES, self._server)

    @property
    def nodes(self) -> NodeDirectory:
        """What the services resolve nodes through (the sim DRA driver serves the same)."""
        return self._nodes

    @property
    def publication(self) -> Publication:
        """The agent's publication (not a pool's)."""
        assert self._pub is not None, "a pool serves many"
        return self._pub

    def malformed_requests(self) -> int:
        """Requests refused because their bytes did not parse."""
        return self._malformed.count

    def certificate_reloads(self) -> Reloads | None:
        """TLS renewals taken up and refused; None without TLS."""
        return None if self._certificates is None else self._certificates.reloads()

    async def start(self) -> None:
        """Bind every listener and start serving. Raises ServeError; binds all or none."""
        try:
            for listener in self._settings.listeners:
                self.addresses.append(self._bind(listener))
        except BaseException:
            self._remove_sockets()
            raise
        await self._server.start()
        self._feeder = asyncio.create_task(self._watch.feed(), name="capwatch-watch-feed")
        self._feeder.add_done_callback(self._supervise)
        if self._pub is not None:
            self._tracker = asyncio.create_task(
                track_readiness(self._health, self._pub), name="capwatch-grpc-health"
            )
            self._tracker.add_done_callback(self._supervise)
        else:
            for service in SERVICES:
                await self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info("grpc serving addresses=%s", ",".join(self.addresses))

    async def stop(self) -> None:
        """Readiness first, then the streams, then the server; each step bounded."""
        self._stopping = True
        await self._health.enter_graceful_shutdown()
        for served in self._nodes.served():
            served.publication.stopping.set()
            served.publication.hub.release_readers()  # Watch streams end with OK, not a reset
        await self._server.stop(self._settings.grace_s)
        for task in (self._feeder, self._tracker):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._remove_sockets()
        log.info("grpc stopped")

    def _bind(self, listener: Listener) -> str:
        if listener.unix_path is not None:
            return self._bind_unix(listener.unix_path)
        where = f"--grpc-listen: cannot listen on {listener.address}"
        busy = address_in_use(listener.address)
        if busy:
            raise ServeError(f"{where}: {busy}")
        tls = self._settings.tls
        try:
            if tls is None:
                port = self._server.add_insecure_port(listener.address)
            else:
                if self._certificates is None:  # one reloader for every TLS listener
                    self._certificates = ReloadingCertificates(tls)
                port = self._server.add_secure_port(
                    listener.address, self._certificates.credentials()
                )
        except (RuntimeError, OSError, CertificateError) as exc:
            # grpc's advice to set GRPC_VERBOSITY is for grpc's developers, not ours.
            reason = str(exc).split("; set GRPC_VERBOSITY", 1)[0]
            raise ServeError(
                f"--grpc-listen: cannot listen on {listener.address}: {reason}"
            ) from exc
        if port == 0:
            raise ServeError(
                f"--grpc-listen: cannot listen on {listener.address} (address in use?)"
            )
        host = listener.address.rsplit(":", 1)[0]
        return f"{host}:{port}"

    def _bind_unix(self, path: Path) -> str:
        # 0660 from the start: the shim reaches the socket through its group.
        bind_unix(self._server.add_insecure_port, path, umask=0o117)
        self._sockets.append(path)
        if self._settings.socket_group:
            group = self._settings.socket_group
            try:
                # A numeric group need not exist in the image's /etc/group.
                shutil.chown(path, group=int(group) if is_digits(group) else group)
            except (LookupError, OSError) as exc:
                raise ServeError(
                    f"cannot give {path} to group {self._settings.socket_group}: {exc}"
                ) from exc
        return f"unix://{path}"

    def _remove_sockets(self) -> None:
        for path in self._sockets:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self._sockets.clear()

    def _supervise(self, task: asyncio.Task[None]) -> None:
        ended(task, stopping=self._stopping, on_fatal=self._on_fatal, log=log)
