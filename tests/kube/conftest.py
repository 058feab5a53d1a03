"""Fixtures: a running fake API server, capwatch's own transport pointed at it,
a factory of transports naming themselves by User-Agent, and a factory of pod views;
and for the fake's contract tests, ``apiserver``: the same test against the fake and
against a real kube-apiserver (tests/realkube), through :mod:`tests.kube.servers`.

The real param runs on two control planes of this directory's own, started once
per run (a few seconds each) and only when a test asks: ``contract_plane``, as
configured by default (the watch cache on: what a cluster serves), and
``compacting_plane``, with the watch cache off, so that a compaction of etcd
expires resourceVersions and continue tokens on demand (``expiring_apiserver``).
Own planes rather than the shared ``realkube``: the tests create cluster-scoped
Nodes by fixed names and list them all, which no other test may disturb.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from capwatch.agent.kube.podview import PodInformer
from capwatch.kit.clock import SystemClock
from capwatch.kube.access import ClusterAccess
from capwatch.kube.informer import WatchPolicy
from capwatch.kube.transport import ApiTransport
from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.kube.rawapi import client_for
from tests.kube.realserver import RealApiServer, prepare
from tests.kube.servers import ApiServer, FakeApiServer
from tests.kube.support import NODE, kube_pod_view
from tests.realkube.controlplane import ControlPlane, ControlPlaneError


@pytest.fixture
def kube_apiserver() -> Iterator[FakeKubeApiServer]:
    """A fake API server on 127.0.0.1:<ephemeral>, stopped after the test."""
    server = FakeKubeApiServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def kube_api_client(kube_apiserver: FakeKubeApiServer) -> Iterator[ApiTransport]:
    """capwatch's transport to the fake server: plain http, no auth (as
    ``api_transport`` builds it from a kubeconfig naming the fake)."""
    client = ApiTransport(ClusterAccess(server=kube_apiserver.url), user_agent="test")
    yield client
    client.close()


ViewFactory = Callable[..., PodInformer]
_POLICY_FIELDS = {field.name for field in dataclasses.fields(WatchPolicy)}


@pytest.fixture
def make_view(kube_api_client: ApiTransport) -> Iterator[ViewFactory]:
    """Build (and by default start) views on ``node-a`` with test-sized timings;
    every view is closed after the test."""
    views: list[PodInformer] = []

    def factory(*, start: bool = True, **overrides: Any) -> PodInformer:
        """``overrides``: WatchPolicy fields and PodInformer arguments alike."""
        timings: dict[str, Any] = {
            "stale_after": 0.4,
            "backoff_initial": 0.005,
            "backoff_max": 0.02,
            "request_timeout": 5.0,
        }
        settings: dict[str, Any] = {
            "node_name": NODE,
            "transport": kube_api_client,
            "clock": SystemClock(),
            "rng": random.Random(7),
        }
        for name, value in overrides.items():
            (timings if name in _POLICY_FIELDS else settings)[name] = value
        view = kube_pod_view(policy=WatchPolicy(**timings), **settings)
        views.append(view)
        if start:
            view.start()
        return view

    yield factory
    for view in views:
        view.close()


ClientFactory = Callable[[str], ApiTransport]


@pytest.fixture
def make_client(kube_apiserver: FakeKubeApiServer) -> Iterator[ClientFactory]:
    """Transports to the fake, each naming itself by the User-Agent given;
    all closed after the test."""
    clients: list[ApiTransport] = []

    def factory(user_agent: str) -> ApiTransport:
        client = client_for(kube_apiserver, user_agent=user_agent)
        clients.append(client)
        return client

    yield factory
    for client in clients:
        client.close()


def _plane(
    factory: pytest.TempPathFactory, binaries: dict[str, Path], name: str, *args: str
) -> Iterator[ControlPlane]:
    plane = ControlPlane(factory.mktemp(name), binaries=binaries, apiserver_args=args)
    try:
        plane.start()
        prepare(plane)
    except ControlPlaneError as err:
        plane.stop()
        pytest.fail(f"real control plane did not start: {err}", pytrace=False)
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def contract_plane(
    realkube_binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver as a cluster runs them (watch cache on), for this directory."""
    yield from _plane(tmp_path_factory, realkube_binaries, "contract")


@pytest.fixture(scope="session")
def compacting_plane(
    realkube_binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver serving every read from etcd (``--watch-cache=false``): a
    compaction expires old resourceVersions at once, where a watch cache would still
    serve them from its own history."""
    yield from _plane(tmp_path_factory, realkube_binaries, "compacting", "--watch-cache=false")


@pytest.fixture
def real(contract_plane: ControlPlane) -> Iterator[RealApiServer]:
    """The real kube-apiserver alone (what the fake cannot model: field ownership,
    the API's own validation), cleaned after the test."""
    server = RealApiServer(contract_plane)
    try:
        yield server
    finally:
        server.close()
        server.clean()


def _server(request: pytest.FixtureRequest, plane_fixture: str) -> Iterator[ApiServer]:
    server: ApiServer
    if request.param == "fake":
        server = FakeApiServer(request.getfixturevalue("kube_apiserver"))
        yield server
        server.close()
        return
    plane = request.getfixturevalue(plane_fixture)
    real = RealApiServer(plane, compacting=plane_fixture == "compacting_plane")
    try:
        yield real
    finally:
        real.close()
        real.clean()


@pytest.fixture(params=["fake", "real"])
def apiserver(request: pytest.FixtureRequest) -> Iterator[ApiServer]:
    """The fake, then a real kube-apiserver: one contract test, both servers."""
    yield from _server(request, "contract_plane")


@pytest.fixture(params=["fake", "real"])
def expiring_apiserver(request: pytest.FixtureRequest) -> Iterator[ApiServer]:
    """As ``apiserver``, on servers whose ``compact()`` expires every older version."""
    yield from _server(request, "compacting_plane")
