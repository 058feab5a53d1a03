"""Fixtures: a running fake API server, a real ``kubernetes`` client pointed at it,
a factory of clients naming themselves by User-Agent, and a factory of pod views."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes.client
import pytest

from agent.kube.client import KubernetesPodView
from agent.kube.informer import WatchPolicy
from kit.clock import SystemClock
from tests.fakes.kube_apiserver import FakeKubeApiServer
from tests.kube.rawapi import client_for
from tests.kube.support import NODE


@pytest.fixture
def kube_apiserver() -> Iterator[FakeKubeApiServer]:
    """A fake API server on 127.0.0.1:<ephemeral>, stopped after the test."""
    server = FakeKubeApiServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def kube_api_client(kube_apiserver: FakeKubeApiServer) -> Iterator[kubernetes.client.ApiClient]:
    """A real ApiClient for the fake server: plain http, no auth, no urllib3 retries
    (as ``api_client_from_environment`` configures it)."""
    configuration = kubernetes.client.Configuration(host=kube_apiserver.url)
    configuration.retries = False
    client = kubernetes.client.ApiClient(configuration)
    yield client
    client.close()


ViewFactory = Callable[..., KubernetesPodView]
_POLICY_FIELDS = {field.name for field in dataclasses.fields(WatchPolicy)}


@pytest.fixture
def make_view(kube_api_client: kubernetes.client.ApiClient) -> Iterator[ViewFactory]:
    """Build (and by default start) views on ``node-a`` with test-sized timings;
    every view is closed after the test."""
    views: list[KubernetesPodView] = []

    def factory(*, start: bool = True, **overrides: Any) -> KubernetesPodView:
        """``overrides``: WatchPolicy fields and KubernetesPodView arguments alike."""
        timings: dict[str, Any] = {
            "stale_after": 0.4,
            "backoff_initial": 0.005,
            "backoff_max": 0.02,
            "request_timeout": 5.0,
        }
        settings: dict[str, Any] = {
            "node_name": NODE,
            "api_client": kube_api_client,
            "clock": SystemClock(),
            "rng": random.Random(7),
        }
        for name, value in overrides.items():
            (timings if name in _POLICY_FIELDS else settings)[name] = value
        view = KubernetesPodView(policy=WatchPolicy(**timings), **settings)
        views.append(view)
        if start:
            view.start()
        return view

    yield factory
    for view in views:
        view.close()


ClientFactory = Callable[[str], kubernetes.client.ApiClient]


@pytest.fixture
def make_client(kube_apiserver: FakeKubeApiServer) -> Iterator[ClientFactory]:
    """Real ApiClients for the fake, each naming itself by the User-Agent given;
    all closed after the test."""
    clients: list[kubernetes.client.ApiClient] = []

    def factory(user_agent: str) -> kubernetes.client.ApiClient:
        client = client_for(kube_apiserver, user_agent=user_agent)
        clients.append(client)
        return client

    yield factory
    for client in clients:
        client.close()
