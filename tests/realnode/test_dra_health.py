"""The kubelet reads capwatch's DRA health mirror through its own code.

The chart with the sim backend and ``dra.simDriver.enabled``: capwatch publishes the
node's ResourceSlice (driver sim.capwatch.io), registers with the kubelet and serves
the health mirror on its plugin socket. A ResourceClaim selects GPU 4 by its ``index``
attribute (CEL); the scheduler allocates it, the kubelet prepares it through capwatch
and starts a pod using it. The built-in scenario loses GPU 4 in cycles 12-14: the
kubelet writes ``Unhealthy`` into the pod's ``allocatedResourcesStatus``, and
``Healthy`` once the GPU is back, never ``Unknown`` while capwatch runs. Frozen
(SIGSTOP), capwatch's stream stays open and silent: the kubelet reads the device
``Unknown`` once the timeout capwatch sent (3 x interval) has passed, at the pod's next
status sync; thawed, ``Healthy``. Uninstalled, capwatch's stream ends, and the kubelet
turns the device ``Unknown`` at the pod's next status sync. The test watches the mirror
itself too (a second client on the plugin socket) and prints how long after the
mirror's change the pod status showed it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from capwatch.api.gen.v1 import dra_health_pb2 as v1_pb
from capwatch.api.gen.v1 import dra_health_pb2_grpc as v1_grpc
from tests.realkube.access import ApiError
from tests.realnode.cluster import Cluster, wait_for
from tests.realnode.images import PAUSE_IMAGE

NAMESPACE = "dra-health"
RELEASE = "dra"
WORKLOAD = "dra-jobs"
INTERVAL_S = 5  # cycle 12, GPU 4's loss, about a minute after the agent starts
GPU = 4
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
HEALTH = {v1_pb.HEALTHY: "Healthy", v1_pb.UNHEALTHY: "Unhealthy", v1_pb.UNKNOWN: "Unknown"}


@dataclass
class Seen:
    """Each change of one thing's health, with the monotonic time it was seen."""

    changes: list[tuple[float, str]] = field(default_factory=list)
    ended: float | None = None  # when the stream ended, if the agent ended it

    def add(self, health: str) -> None:
        if not self.changes or self.changes[-1][1] != health:
            self.changes.append((time.monotonic(), health))

    def first(self, health: str, after: float = 0.0) -> float | None:
        return next((t for t, h in self.changes if h == health and t >= after), None)


@contextmanager
def watching_the_mirror(socket: str, device: str) -> Iterator[Seen]:
    """NodeWatchResources on the plugin socket, as a second client beside the kubelet."""
    seen = Seen()
    channel = grpc.insecure_channel(f"unix://{socket}")
    call = v1_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
        v1_pb.NodeWatchResourcesRequest()
    )

    def read() -> None:
        try:
            for message in call:
                for entry in message.devices:
                    if entry.device.device_name == device:
                        seen.add(HEALTH[entry.health])
        except grpc.RpcError as err:
            if err.code() is grpc.StatusCode.CANCELLED:
                return  # ours, at the end
        seen.ended = time.monotonic()  # the agent ended it, or went away

    reader = threading.Thread(target=read, name="mirror-watch", daemon=True)
    reader.start()
    try:
        yield seen
    finally:
        call.cancel()
        channel.close()
        reader.join(10)


def claim_status(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod's main container's allocatedResourcesStatus, as the kubelet wrote it."""
    for status in pod.get("status", {}).get("containerStatuses", []):
        if status["name"] == "main":
            return list(status.get("allocatedResourcesStatus", []))
    return []


def device_health(pod: dict[str, Any]) -> str | None:
    for entry in claim_status(pod):
        if entry["name"] == "claim:gpu":
            (resource,) = entry["resources"]
            return str(resource["health"])
    return None


def one_gpu_claim() -> dict[str, Any]:
    selector = f'device.attributes["sim.capwatch.io"].index == {GPU}'
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "one-gpu"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "sim.capwatch.io",
                            "selectors": [{"cel": {"expression": selector}}],
                        },
                    }
                ]
            }
        },
    }


def claiming_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "uses-gpu"},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "one-gpu"}],
            "containers": [
                {
                    "name": "main",
                    "image": PAUSE_IMAGE,
                    "imagePullPolicy": "Never",
                    "resources": {"claims": [{"name": "gpu"}]},
                    "securityContext": {
                        "runAsNonRoot": True,
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_kubelet_writes_capwatchs_health_into_the_pod_status(realnode: Cluster) -> None:
    """Healthy once prepared, Unhealthy through GPU 4's loss, Healthy after, never
    Unknown while capwatch runs; Unknown once capwatch is uninstalled."""
    plane = realnode.node.plane
    kubelet_dir = realnode.node.kubelet_paths.root_dir
    node = realnode.node.node_name
    realnode.install(
        RELEASE, NAMESPACE,
        "--set", "dra.simDriver.enabled=true",
        "--set", f"dra.simDriver.kubeletDir={kubelet_dir}",
        "--set", f"agent.interval={INTERVAL_S}",
    )  # fmt: skip
    installed = True
    realnode.ensure_namespace(WORKLOAD)
    claims = f"/apis/resource.k8s.io/v1/namespaces/{WORKLOAD}/resourceclaims"
    try:
        published = wait_for(
            lambda: (
                plane.request("GET", f"{SLICES}?fieldSelector=spec.driver%3Dsim.capwatch.io")[
                    "items"
                ]
                or None
            ),
            120.0,
            "the sim driver's ResourceSlice",
        )
        (found,) = published
        assert found["spec"]["nodeName"] == node
        names = [d["name"] for d in found["spec"]["devices"]]
        assert names == [f"gpu-{i}" for i in range(6)]
        plane.request("POST", claims, one_gpu_claim())
        realnode.create_pod(WORKLOAD, claiming_pod())
        pod_path = f"/api/v1/namespaces/{WORKLOAD}/pods/uses-gpu"
        socket = str(kubelet_dir / "plugins" / "sim.capwatch.io" / "dra.sock")
        in_pod = Seen()
        with watching_the_mirror(socket, f"gpu-{GPU}") as mirror:

            def health(want: str) -> dict[str, Any] | None:
                pod = plane.request("GET", pod_path)
                now = device_health(pod)
                if now is not None:
                    in_pod.add(now)
                return pod if now == want else None

            first = wait_for(lambda: health("Healthy"), 120.0, "the claimed GPU Healthy")
            assert first["status"]["phase"] == "Running"
            (entry,) = claim_status(first)
            assert entry["resources"][0]["resourceID"] == f"sim.capwatch.io/{node}/gpu-{GPU}"
            down = wait_for(lambda: health("Unhealthy"), 180.0, "Unhealthy in the lost cycles")
            message = claim_status(down)[0]["resources"][0].get("message", "")
            assert "GPU lost" in message, message
            wait_for(lambda: health("Healthy") if in_pod.first("Unhealthy") else None, 120.0,
                     "Healthy again after recovery")  # fmt: skip
            running = list(in_pod.changes)
            assert [h for _, h in running] == ["Healthy", "Unhealthy", "Healthy"], running
            lags = {state: t - (mirror.first(state, after=running[0][0]) or t)
                    for t, state in running[1:]}  # fmt: skip
            # A hung agent: its stream stays open and silent, so the device's own
            # timeout (3 x interval) runs out in the kubelet's cache.
            agent = realnode.agent_pod(NAMESPACE, RELEASE)
            assert agent is not None
            pid = realnode.container_pid(agent, "agent")
            os.kill(pid, signal.SIGSTOP)
            frozen = time.monotonic()
            try:
                wait_for(lambda: health("Unknown"), 120.0, "Unknown while the agent is frozen")
            finally:
                os.kill(pid, signal.SIGCONT)
            hung = in_pod.changes[-1][0] - frozen
            wait_for(lambda: health("Healthy"), 120.0, "Healthy once the agent is thawed")
            # Uninstalled (helm waits for the pod to go, so beside the polling): the
            # agent ends its streams, the kubelet's among them.
            # The moment the kubelet unregisters the plugin (its registration socket
            # goes first) and ends its own stream.
            registration = kubelet_dir / "plugins_registry" / "sim.capwatch.io-reg.sock"
            unregistered: list[float] = []

            def unknown_once_gone() -> dict[str, Any] | None:
                if not unregistered and not registration.exists():
                    unregistered.append(time.monotonic())
                return health("Unknown")

            remover = threading.Thread(target=realnode.uninstall, args=(RELEASE, NAMESPACE))
            remover.start()
            wait_for(unknown_once_gone, 120.0, "Unknown once capwatch is gone")
            remover.join(180)
            installed = remover.is_alive()
            assert mirror.ended is not None  # the agent ended the streams itself
            gone = in_pod.changes[-1][0] - unregistered[0]
        print(  # the figures docs/dra-health.md quotes
            f"\nkubelet after the mirror: Unhealthy {lags['Unhealthy']:.1f} s, Healthy "
            f"{lags['Healthy']:.1f} s; Unknown {hung:.1f} s after the agent froze, "
            f"{gone:.1f} s after the uninstalled agent unregistered"
        )
    finally:
        # At once: capwatch is gone, nothing would answer the kubelet's unprepare.
        for path in (f"/api/v1/namespaces/{WORKLOAD}/pods/uses-gpu", f"{claims}/one-gpu"):
            with contextlib.suppress(ApiError):
                plane.request("DELETE", f"{path}?gracePeriodSeconds=0")
        if installed:
            realnode.uninstall(RELEASE, NAMESPACE)
