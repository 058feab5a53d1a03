"""The election's Lease writes on the real API server, through the production KubeApi:
what a renewal keeps of the object, and a release that loses to the leader's own
renewal in flight (controller/leasing.py, controller/kube.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from capwatch.controller.kube import KubeApi, api_client
from capwatch.controller.leasing import LeaseConfig, LeaseElector, LeaseRecord
from capwatch.kit.clock import SystemClock
from tests.realkube.controlplane import ControlPlane

NAME = "capwatch-controller-0"
# Short, so the test takes seconds; the real sizes are checked on virtual time.
CONFIG = LeaseConfig(lease_s=6.0, renew_deadline_s=4.0, retry_s=0.5)
KEPT = {
    "labels": {"team": "gpu"},
    "annotations": {"capwatch.io/note": "kept"},
    "ownerReferences": [
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "name": "capwatch-controller",
            "uid": "1f0c9f5e-0000-4000-8000-000000000000",
        }
    ],
    "finalizers": ["capwatch.io/test-keep"],
}


class SlowAnswers(KubeApi):
    """The production API, whose Lease updates land at once but answer late."""

    slow_answer_s = 0.0

    async def update_lease(
        self, name: str, record: LeaseRecord, *, deadline_s: float
    ) -> LeaseRecord:
        written = await super().update_lease(name, record, deadline_s=deadline_s)
        if self.slow_answer_s:
            await asyncio.sleep(self.slow_answer_s)
        return written


@pytest.fixture
def api_factory(realkube: ControlPlane, realkube_namespace: str) -> Iterator[Any]:
    made: list[KubeApi] = []

    def make(identity: str) -> SlowAnswers:
        client = api_client(str(realkube.kubeconfig), identity=identity)
        api = SlowAnswers(client, namespace=realkube_namespace, identity=identity)
        made.append(api)
        return api

    yield make
    for api in made:
        api.close()


@contextlib.asynccontextmanager
async def campaigning(elector: LeaseElector) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(elector.run(), name=f"elector-{elector.identity}")
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def until(condition: Any, *, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def elector(api: KubeApi, identity: str) -> LeaseElector:
    return LeaseElector(api=api, name=NAME, identity=identity, clock=SystemClock(), config=CONFIG)


def lease(realkube: ControlPlane, namespace: str) -> dict[str, Any]:
    got: dict[str, Any] = realkube.request(
        "GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{NAME}"
    )
    return got


@pytest.mark.slow
@pytest.mark.asyncio
async def test_acquiring_and_renewing_keep_what_the_election_does_not_own(
    realkube: ControlPlane, realkube_namespace: str, api_factory: Any
) -> None:
    """A Lease someone labelled, annotated, gave an owner and a finalizer (and spec fields
    the election does not set, where the server keeps them) is taken over and renewed
    by the real client: each PUT sends the object back whole, only the election's fields
    changed, so nothing else is wiped."""
    created = realkube.request(
        "POST",
        f"/apis/coordination.k8s.io/v1/namespaces/{realkube_namespace}/leases",
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": NAME, **KEPT},
            "spec": {"holderIdentity": "", "leaseDurationSeconds": 1, "preferredHolder": "b"},
        },
    )
    extra_spec = {k: v for k, v in created["spec"].items() if k == "preferredHolder"}
    a = elector(api_factory("a"), "a")
    async with campaigning(a):
        await until(lambda: a.leading)
        first = lease(realkube, realkube_namespace)["spec"]["renewTime"]
        await until(lambda: lease(realkube, realkube_namespace)["spec"]["renewTime"] != first)
    stored = lease(realkube, realkube_namespace)
    assert stored["spec"]["holderIdentity"] == "a"
    for key, value in KEPT.items():
        assert stored["metadata"][key] == value, key
    for key, value in extra_spec.items():  # empty if the server's gate drops the field
        assert stored["spec"][key] == value


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_release_after_a_late_renewal_hands_over_within_one_retry(
    realkube: ControlPlane, realkube_namespace: str, api_factory: Any
) -> None:
    """The leader is cancelled while its renewal's answer is on its way (the PUT has
    landed: a new resourceVersion it never saw); its release gets 409, reads the Lease
    back, finds itself still the holder and clears it; the standby leads within a few
    retries, well before the lease would have run out."""
    a_api = api_factory("a")
    a, b = elector(a_api, "a"), elector(api_factory("b"), "b")
    async with campaigning(a) as a_task:
        await until(lambda: a.leading)
        async with campaigning(b):
            await asyncio.sleep(CONFIG.retry_s)  # b has read a's record
            a_api.slow_answer_s = 3.0
            seen = lease(realkube, realkube_namespace)["metadata"]["resourceVersion"]
            await until(
                lambda: lease(realkube, realkube_namespace)["metadata"]["resourceVersion"] != seen
            )  # a's renewal landed; its answer comes in 3 s
            a_task.cancel()
            await asyncio.gather(a_task, return_exceptions=True)
            a_api.slow_answer_s = 0.0
            await a.release()
            released_at = time.monotonic()
            assert lease(realkube, realkube_namespace)["spec"]["holderIdentity"] == ""
            await until(lambda: b.leading, timeout=CONFIG.lease_s)
            # One retry with jitter is at most 1.1 s; the lease would have been 6 s.
            assert time.monotonic() - released_at < CONFIG.lease_s / 2
