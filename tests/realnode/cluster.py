"""What the real-node tests do to the node: helm, pods as the API server reports them,
the agent's own stream, the runtime's view of a container, the fake NVML's files.

Everything read here is what the real components wrote: pod conditions come from
the kubelet (the status subresource's managedFields name it), container pids
from containerd, power-limit writes from the fake NVML's own log file.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc

from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.api.gen.capwatch.v1 import node_health_pb2_grpc as pb_grpc
from tests.chart.support import CHART
from tests.realkube.access import ApiError
from tests.realnode import containerd
from tests.realnode.node import RealNode
from tests.realnode.workload import workload_pod

POLL_S = 0.5
T = TypeVar("T")


class Timeout(AssertionError):
    """A wait ran out; the message says what was awaited and what was last seen."""


def wait_for(check: Callable[[], T | None], timeout: float, what: str) -> T:
    """check()'s first truthy answer, polled; Timeout after timeout seconds."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            answer = check()
        except ApiError as err:  # the object may not exist yet
            answer, last = None, err
        if answer:
            return answer
        if time.monotonic() > deadline:
            raise Timeout(f"{what}: not within {timeout:.0f}s (last: {last})")
        time.sleep(POLL_S)


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """The node, and helm with private homes pointed at its API server."""

    node: RealNode
    helm_binary: Path
    helm_home: Path

    # -- helm ---------------------------------------------------------------------------

    def helm(self, *args: str, timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.helm_home),
            "HELM_CACHE_HOME": str(self.helm_home / "cache"),
            "HELM_CONFIG_HOME": str(self.helm_home / "config"),
            "HELM_DATA_HOME": str(self.helm_home / "data"),
            "KUBECONFIG": str(self.node.kubeconfig),
        }
        return subprocess.run(
            [str(self.helm_binary), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
        )

    def install(self, release: str, namespace: str, *args: str) -> None:
        """helm install of the unchanged chart with the node's values.yaml and the
        release's own state directory, then args."""
        done = self.helm(
            "install", release, str(CHART), "--namespace", namespace, "--create-namespace",
            *self._values(release), *args,
        )  # fmt: skip
        assert done.returncode == 0, f"helm install failed:\n{done.stderr}"

    def upgrade(self, release: str, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
        return self.helm(
            "upgrade", release, str(CHART), "--namespace", namespace,
            *self._values(release), *args,
        )  # fmt: skip

    def _values(self, release: str) -> tuple[str, ...]:
        state = self.node.state_dir(release)
        return ("--values", str(self.node.values_path), "--set", f"agent.stateHostPath={state}")

    def uninstall(self, release: str, namespace: str) -> None:
        """helm uninstall, returning once the release's pods are gone from the node."""
        self.helm("uninstall", release, "--namespace", namespace, "--wait", "--timeout", "120s")
        wait_for(lambda: not self.pods(namespace), 120.0, f"{release}'s pods gone")

    # -- pods ---------------------------------------------------------------------------

    def pods(self, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        query = f"?labelSelector={selector}" if selector else ""
        listed: dict[str, Any] = self.node.plane.request(
            "GET", f"/api/v1/namespaces/{namespace}/pods{query}"
        )
        return list(listed["items"])

    def agent_pod(self, namespace: str, release: str) -> dict[str, Any] | None:
        """The release's one agent pod that is not being deleted, or None."""
        selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/component=node-agent"
        live = [
            pod
            for pod in self.pods(namespace, selector)
            if "deletionTimestamp" not in pod["metadata"]
        ]
        return live[0] if len(live) == 1 else None

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.node.plane.request(
            "GET", f"/api/v1/namespaces/{namespace}/pods/{name}"
        )
        return found

    def create_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = self.node.plane.request(
            "POST", f"/api/v1/namespaces/{namespace}/pods", body
        )
        return created

    def run_workload(self, namespace: str, name: str, *, watts: int | None) -> dict[str, Any]:
        """A workload pod (workload.py) created and Running; the pod as then read."""
        self.ensure_namespace(namespace)
        self.create_pod(namespace, workload_pod(name, watts=watts))

        def running() -> dict[str, Any] | None:
            pod = self.pod(namespace, name)
            return pod if pod["status"].get("phase") == "Running" else None

        return wait_for(running, 120.0, f"the workload {name} Running")

    def ensure_namespace(self, name: str) -> None:
        try:
            self.node.plane.create_namespace(name)
        except ApiError as err:
            if err.status != 409:
                raise

    # -- the runtime and the agent ------------------------------------------------------

    def container_pid(self, pod: dict[str, Any], container: str) -> int:
        """The host pid of a pod's running container, as containerd reports it."""
        statuses = {status["name"]: status for status in pod["status"]["containerStatuses"]}
        container_id = statuses[container]["containerID"].removeprefix("containerd://")
        return containerd.tasks(self.node.runtime)[container_id]

    def kill_container(self, pod: dict[str, Any], container: str) -> None:
        """SIGKILL a container's task through containerd, as an OOM kill or crash would end it."""
        statuses = {status["name"]: status for status in pod["status"]["containerStatuses"]}
        container_id = statuses[container]["containerID"].removeprefix("containerd://")
        containerd.ctr(self.node.runtime, "tasks", "kill", "--signal", "SIGKILL", container_id)

    def snapshot(self, pod: dict[str, Any]) -> pb.NodeSnapshot:
        """GetSnapshot from the agent's gRPC port on its pod IP (across the bridge)."""
        address = f"{pod['status']['podIP']}:50051"
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.NodeHealthServiceStub(channel)
            response = stub.GetSnapshot(
                pb.GetSnapshotRequest(node_name=self.node.node_name), timeout=10
            )
        return response.snapshot

    def tag_image(self, tag: str) -> str:
        """The node's capwatch image under another tag, as a new release would arrive
        (no registry: containerd holds it); the new reference."""
        assert self.node.image_reference is not None
        repository = self.node.image_reference.rpartition(":")[0]
        tagged = f"{repository}:{tag}"
        if tagged not in containerd.images(self.node.runtime):
            containerd.ctr(self.node.runtime, "images", "tag", self.node.image_reference, tagged)
        return tagged

    def rollout_restart(self, namespace: str, daemonset: str) -> None:
        """What `kubectl rollout restart` does: a new template annotation."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        patch = {
            "spec": {
                "template": {
                    "metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": stamp}}
                }
            }
        }
        self.node.plane.request_text(
            "PATCH",
            f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{daemonset}",
            patch,
            content_type="application/strategic-merge-patch+json",
        )

    def write_fakenvml(self, lines: list[str]) -> None:
        """The fake NVML's configuration, read by each agent process at its first nvmlInit."""
        (self.node.fakenvml_dir / "config").write_text("\n".join(lines) + "\n", encoding="utf-8")

    def fakenvml_writes(self, name: str = "writes.log") -> list[dict[str, str]]:
        """Every power-limit write the fake NVML logged (log_file NAME in its config)."""
        path = self.node.fakenvml_dir / name
        if not path.is_file():
            return []
        entries = []
        for line in path.read_text(encoding="utf-8").splitlines():
            fields = dict(field.split("=", 1) for field in line.split()[1:] if "=" in field)
            entries.append(fields)
        return entries


def ready(pod: dict[str, Any]) -> str | None:
    """The pod's Ready condition status ("True", "False"), or None before it has one."""
    for condition in pod.get("status", {}).get("conditions", []):
        if condition["type"] == "Ready":
            return str(condition["status"])
    return None


def status_writers(pod: dict[str, Any]) -> set[str]:
    """Who wrote the pod's status subresource (its managedFields' managers)."""
    return {
        entry["manager"]
        for entry in pod["metadata"].get("managedFields", [])
        if entry.get("subresource") == "status"
    }
