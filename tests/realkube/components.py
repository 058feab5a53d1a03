"""capwatch's components on a real API server, as the chart runs them: a :class:`Scene`.

A scene is one test's release of the chart (:class:`~tests.realkube.chart.Release`)
in the test's namespace, its RBAC applied, and the processes started from the chart's
own rendered container args, with only what differs off-cluster replaced: the
kubeconfig (a TokenRequest token of the component's ServiceAccount, never admin),
loopback ports, short timings, text logs. The downward API's fields become the
environment the pod would have (POD_NAME, POD_NAMESPACE, NODE_NAME).

Agents are ``capwatch pool`` (many simulated nodes behind one gRPC server on a loopback
address of the test's own) or, with the fake libnvidia-ml, a real ``capwatch agent``.
Nodes (with the label the chart's GPU node selector asks for), agent pods (with the
DaemonSet's pod labels, Running with a loopback podIP) and each controller replica's
StatefulSet pod (its token is bound to it, so its Lease identity <pod>_<uid> is what
the chart's fencing policy can check) are made as admin, as the kubelet and the
controllers would. Everything a scene made outside its namespace (Nodes, cluster RBAC,
fencing policies, Node Events, and what a test lists in :attr:`Scene.paths`) is deleted
when it closes.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.api.gen.capwatch.v1 import node_health_pb2_grpc as pb_grpc
from tests.chart.support import Helm
from tests.controller.e2e.processes import (
    CAPWATCH,
    CHANGE_S,
    ROOT,
    Process,
    clean_environ,
    wait_until,
)
from tests.realkube.access import ApiError, BoundPod
from tests.realkube.chart import (
    Release,
    apply,
    kubeconfig,
    remove,
    wait_authorized,
)
from tests.realkube.controlplane import ControlPlane
from tests.realkube.local import Loopback, Processes, downward_env, flag, without_flags

CONDITION = "GPUPowerCapEnforced"
SMP = "application/strategic-merge-patch+json"
FENCING_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
POOL_INTERVAL_S = 1.0  # the pool's cycle: the controller's staleness bound is 3 s
# Lease timings scaled down from the chart's 15/10/2, in the same proportions roughly.
LEASE_S, RENEW_S, RETRY_S = 4.0, 3.0, 0.5
# Flags whose chart values only make sense in a pod: replaced off-cluster.
CONTROLLER_REPLACED = (
    "--grpc-listen", "--metrics-port", "--probe-port", "--lease-duration", "--renew-deadline",
    "--retry-period", "--condition-heartbeat", "--agent-port", "--log-format",
)  # fmt: skip
AGENT_REPLACED = (
    "--grpc-listen", "--grpc-socket-group", "--metrics-port", "--state-dir", "--proc-root",
    "--interval", "--log-format", "--pod-silence-bound",
)  # fmt: skip


@dataclass(kw_only=True)
class Scene:
    """One test's release on a real API server, and the processes it runs."""

    plane: ControlPlane
    release: Release
    directory: Path
    processes: Processes
    loopback: Loopback = field(default_factory=Loopback)
    nodes: list[str] = field(default_factory=list)
    # Other cluster-scoped objects a test made (ResourceSlices, say), by API path.
    paths: list[str] = field(default_factory=list)
    installed: list[dict[str, Any]] = field(default_factory=list)
    tokens: dict[int, str] = field(default_factory=dict)  # each replica's, by ordinal
    pools: dict[int, Process] = field(default_factory=dict)  # by loopback address

    @property
    def namespace(self) -> str:
        return self.release.namespace

    # --- RBAC and identities -------------------------------------------------------------

    def install(self, *components: str) -> None:
        """Apply the components' rendered RBAC as admin and wait until it is in effect."""
        for component in components:
            objects = self.release.objects(component)
            apply(self.plane, objects)
            self.installed += objects
            wait_authorized(
                self.plane, self.release.user(component), allow=self.release.grants(component)
            )

    def install_fencing(self) -> None:
        """Apply the rendered fencing policies and bindings (controller.fencing) as admin,
        after the controller's RBAC; wait until the server enforces them: a node status
        write with a token of the controller's account that is bound to no pod (so no
        replica's) is refused by the policy."""
        objects = [o for o in self.release.manifests if o["kind"] in FENCING_KINDS]
        assert objects, "the release renders no fencing policy"
        apply(self.plane, objects)
        self.installed += objects
        probe = f"probe-{uuid.uuid4().hex[:8]}"
        self.plane.request(
            "POST",
            "/api/v1/nodes",
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": probe}},
        )
        self.nodes.append(probe)
        unbound = self.plane.token(self.namespace, self.release.service_account("controller"))
        patch = {"status": {"conditions": [{"type": CONDITION, "$patch": "delete"}]}}

        def refused() -> bool:
            try:
                self.patch_as(unbound, f"/api/v1/nodes/{probe}/status", patch)
            except ApiError as err:
                return err.status == 403 and "capwatch fencing" in err.body
            return False

        wait_until(refused, what="the fencing policies to be enforced")

    def upgrade(self, helm: Helm, *values: str) -> None:
        """``helm upgrade`` of the release's objects with ``values`` (its RBAC and fencing
        as rendered anew, applied as admin); the pods are the test's to roll."""
        kinds = {o["kind"] for o in self.installed}
        self.release = Release.render(helm, self.namespace, values=values, name=self.release.name)
        objects = [o for o in self.release.manifests if o["kind"] in kinds]
        rendered = {(o["kind"], o["metadata"]["name"]) for o in objects}
        apply(self.plane, objects)
        # What the new render no longer has, helm deletes.
        gone = [o for o in self.installed if (o["kind"], o["metadata"]["name"]) not in rendered]
        remove(self.plane, gone)
        self.installed = objects

    def installed_kinds(self) -> set[str]:
        return {o["kind"] for o in self.installed}

    def patch_as(self, token: str, path: str, body: Mapping[str, Any]) -> None:
        """A strategic-merge PATCH with ``token`` (raises ApiError as the server answers)."""
        self.plane.request_text("PATCH", path, body, token=token, content_type=SMP)

    def kubeconfig(self, component: str, *, pod: BoundPod | None = None) -> Path:
        path = self.directory / f"{component}-{uuid.uuid4().hex[:6]}.kubeconfig"
        return kubeconfig(self.plane, self.release, component, path, pod=pod)

    def close(self) -> None:
        self.processes.close()
        for path in self.paths:
            self.delete(path)
        for node in self.nodes:
            self.delete(f"/api/v1/nodes/{node}")
            selector = f"involvedObject.kind=Node,involvedObject.name={node}"
            self.delete(f"/api/v1/namespaces/default/events?fieldSelector={selector}")
        remove(self.plane, [o for o in self.installed if "namespace" not in o["metadata"]])

    def delete(self, path: str) -> None:
        """DELETE as admin; one already gone is no error."""
        try:
            self.plane.request("DELETE", path)
        except ApiError as err:
            if err.status != 404:
                raise

    # --- what the kubelet and the scheduler would make -----------------------------------

    def gpu_labels(self) -> dict[str, str]:
        """The labels the chart's --gpu-node-selector selects (equality terms)."""
        args = self.release.container("StatefulSet", "controller")["args"]
        return dict(t.split("=", 1) for t in flag(args, "--gpu-node-selector").split(","))

    def gpu_node(self, name: str, conditions: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
        """A Node with the GPU label (and ``conditions`` in its status, as a kubelet sets)."""
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
        body["metadata"]["labels"] = self.gpu_labels()  # type: ignore[index]
        node: dict[str, Any] = self.plane.request("POST", "/api/v1/nodes", body)
        self.nodes.append(name)
        if conditions:
            node["status"] = {"conditions": list(conditions)}
            node = self.plane.request("PUT", f"/api/v1/nodes/{name}/status", node)
        return node

    def pod(
        self,
        name: str,
        node: str,
        *,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        account: str | None = None,
        ip: str | None = None,
        namespace: str | None = None,
        owner: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A Pod bound to ``node`` ("": never scheduled); with ``ip`` also Running at that
        podIP (its status set through the status subresource, as the kubelet does)."""
        namespace = namespace or self.namespace
        metadata: dict[str, Any] = {"name": name, "labels": dict(labels or {})}
        if annotations:
            metadata["annotations"] = dict(annotations)
        if owner is not None:
            metadata["ownerReferences"] = [
                {
                    "apiVersion": "apps/v1",
                    "kind": owner["kind"],
                    "name": owner["metadata"]["name"],
                    "uid": owner["metadata"]["uid"],
                    "controller": True,
                }
            ]
        spec: dict[str, Any] = {
            "containers": [{"name": "main", "image": "registry.invalid/capwatch:test"}],
        }
        if node:
            spec["nodeName"] = node
        if account:
            spec["serviceAccountName"] = account
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
        base = f"/api/v1/namespaces/{namespace}/pods"
        pod: dict[str, Any] = self.plane.request("POST", base, body)
        if ip is not None:
            pod["status"] = {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}
            pod = self.plane.request("PUT", f"{base}/{name}/status", pod)
        return pod

    def agent_pod(self, node: str, ip: str, *, owned: bool = False) -> dict[str, Any]:
        """The agent pod of ``node`` (the DaemonSet's labels and account), Running at ``ip``;
        ``owned``: controlled by the release's DaemonSet (:meth:`daemonset`), as the
        agent's shutdown reads it."""
        name = f"{self.release.name}-{uuid.uuid4().hex[:10]}"  # 120 a trial: 5 hex collided
        labels, account = (
            self.release.pod_labels("DaemonSet"),
            self.release.service_account("agent"),
        )
        owner = self.daemonset() if owned else None
        return self.pod(name, node, labels=labels, account=account, ip=ip, owner=owner)

    def daemonset(self) -> dict[str, Any]:
        """The release's DaemonSet as rendered, in the API server (made once; no controller
        here makes its pods): what an agent pod's ownerReference names."""
        rendered = self.release.manifests.one("DaemonSet")
        base = f"/apis/apps/v1/namespaces/{self.namespace}/daemonsets"
        name = rendered["metadata"]["name"]
        try:
            made: dict[str, Any] = self.plane.request("POST", base, rendered)
        except ApiError as err:
            if err.status != 409:
                raise
            made = self.plane.request("GET", f"{base}/{name}")
        return made

    def delete_pod(self, name: str, namespace: str | None = None) -> None:
        """Deleted at once (no kubelet holds it up: grace period 0)."""
        path = f"/api/v1/namespaces/{namespace or self.namespace}/pods/{name}"
        self.plane.request("DELETE", f"{path}?gracePeriodSeconds=0")

    # --- processes -----------------------------------------------------------------------

    def pool(self, prefix: str, nodes: int, n: int = 1) -> Process:
        """``capwatch pool`` serving ``prefix0``... on loopback address ``n``."""
        self.pools[n] = self.processes.start(
            f"pool-{n}",
            [
                "pool",
                *(f"--nodes={nodes}", f"--name-prefix={prefix}", "--gpus=1"),
                f"--interval={POOL_INTERVAL_S:g}",
                f"--grpc-listen={self.loopback.address(n)}",
                "--log-level=warning",
            ],
        )
        return self.pools[n]

    def wait_cycled(self, nodes: Sequence[str], n: int = 1) -> None:
        """Wait until the pool on loopback address ``n`` has completed a cycle of every one
        of ``nodes`` (a stream opened before that reads AgentStarting)."""
        with grpc.insecure_channel(self.loopback.address(n)) as channel:
            stub = pb_grpc.NodeHealthServiceStub(channel)

            def cycled(node: str) -> bool:
                if self.pools[n].popen.poll() is not None:
                    raise AssertionError(f"the pool exited: {self.pools[n].log[-2000:]}")
                try:
                    answer = stub.GetSnapshot(pb.GetSnapshotRequest(node_name=node), timeout=5)
                except grpc.RpcError:
                    return False
                return answer.snapshot.sequence > 0

            for node in nodes:
                wait_until(lambda node=node: cycled(node), timeout=30, what=f"{node} cycled")

    def replica_pod(self, replica: int) -> dict[str, Any]:
        """The StatefulSet's pod ``<name>-<replica>`` (made anew: a new uid, as a restarted
        replica gets), never scheduled: no kubelet runs it, the test does."""
        name = f"{self.release.manifests.one('StatefulSet')['metadata']['name']}-{replica}"
        try:
            self.delete_pod(name)
        except ApiError as err:
            if err.status != 404:
                raise
        account = self.release.service_account("controller")
        labels = self.release.pod_labels("StatefulSet")
        return self.pod(name, "", labels=labels, account=account)

    def controller(self, replica: int, *extra: str, heartbeat_s: float = 300.0) -> Process:
        """Replica ``replica`` of the StatefulSet, as the controller ServiceAccount with a
        token bound to the replica's pod, with the chart's args and short lease timings."""
        container = self.release.container("StatefulSet", "controller")
        pod = self.replica_pod(replica)
        bound = BoundPod(pod["metadata"]["name"], pod["metadata"]["uid"])
        account = self.release.service_account("controller")
        self.tokens[replica] = self.plane.token(self.namespace, account, pod=bound)
        path = self.directory / f"controller-{replica}-{bound.uid[:8]}.kubeconfig"
        config = self.plane.token_kubeconfig(self.tokens[replica], path, namespace=self.namespace)
        args = [
            *without_flags(container["args"], CONTROLLER_REPLACED),
            f"--kubeconfig={config}",
            f"--agent-port={self.loopback.port}",
            *("--grpc-listen=127.0.0.1:0", "--metrics-port=0", "--probe-port=0"),
            *(f"--lease-duration={LEASE_S:g}", f"--renew-deadline={RENEW_S:g}"),
            f"--retry-period={RETRY_S:g}",
            f"--condition-heartbeat={heartbeat_s:g}",
            "--log-format=text",
            *extra,
        ]
        return self.processes.start(f"controller-{replica}", args, downward_env(container, pod))

    def cleanup(self, *, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """The post-delete hook's Job: its args, as the hook's ServiceAccount."""
        container = self.release.container("Job", "cleanup")
        args = [*container["args"], f"--kubeconfig={self.kubeconfig('cleanup')}"]
        return subprocess.run(
            [*CAPWATCH, *args],
            cwd=ROOT,
            env=clean_environ(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def agent(
        self,
        pod: Mapping[str, Any],
        *,
        kubeconfig: Path,
        nvml_config: Path,
        proc_root: Path,
        interval_s: float = 0.2,
        silence_bound_s: float = 5.0,
        listen: str = "127.0.0.1:0",
    ) -> Process:
        """``capwatch agent`` in the agent pod ``pod`` (its node's), with the DaemonSet's args,
        on the fake NVML, its gRPC on ``listen`` (its pod IP and the controller's
        --agent-port, for a controller to discover it)."""
        container = self.release.container("DaemonSet", "agent")
        node = pod["spec"]["nodeName"]
        args = [
            *without_flags(container["args"], AGENT_REPLACED),
            f"--kubeconfig={kubeconfig}",
            *(f"--grpc-listen={listen}", "--metrics-port=0", "--log-format=text"),
            f"--state-dir={self.directory / f'state-{node}'}",
            f"--proc-root={proc_root}",
            f"--interval={interval_s:g}",
            f"--pod-silence-bound={silence_bound_s:g}",
        ]
        env = {**downward_env(container, pod), "FAKE_NVML_CONFIG": str(nvml_config)}
        return self.processes.start(f"agent-{node}", args, env)

    # --- what the API server holds -------------------------------------------------------

    def node(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.plane.request("GET", f"/api/v1/nodes/{name}")
        return found

    def condition(self, node: str) -> dict[str, Any] | None:
        conditions = self.node(node).get("status", {}).get("conditions") or []
        found = [c for c in conditions if c["type"] == CONDITION]
        return found[0] if found else None

    def wait_condition(
        self, node: str, status: str, reason: str, *, timeout: float = CHANGE_S
    ) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            found = self.condition(node)
            if found is not None and (found["status"], found["reason"]) == (status, reason):
                return found
            return None

        return wait_until(
            reached,
            timeout=timeout,
            what=f"{node} {status}/{reason} (now {self.condition(node)})",
        )

    def node_events(self, node: str) -> list[dict[str, Any]]:
        """The Node's Events as `kubectl describe node` finds them: every namespace, by
        kind, name, empty namespace and the uid kubelets give (the node's name)."""
        selector = (
            f"involvedObject.kind=Node,involvedObject.name={node},"
            f"involvedObject.namespace=,involvedObject.uid={node}"
        )
        items: list[dict[str, Any]] = self.plane.request(
            "GET", f"/api/v1/events?fieldSelector={selector}"
        )["items"]
        return sorted(items, key=lambda e: int(e["metadata"]["resourceVersion"]))

    def lease_name(self, shard: int = 0) -> str:
        """Shard ``shard``'s Lease, as the release's controller names it."""
        shards = int(flag(self.release.container("StatefulSet", "controller")["args"], "--shards"))
        return f"{self.release.name}-controller-{shard}-of-{shards}"

    def lease(self, shard: int = 0) -> dict[str, Any] | None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"
        try:
            found: dict[str, Any] = self.plane.request("GET", f"{path}/{self.lease_name(shard)}")
        except ApiError as err:
            if err.status == 404:
                return None
            raise
        return found

    def holder(self) -> str:
        return self.holder_of(0)

    def holder_of(self, shard: int) -> str:
        """Who holds shard ``shard``'s Lease ("": nobody, or no Lease yet)."""
        lease = self.lease(shard)
        return "" if lease is None else str(lease["spec"].get("holderIdentity") or "")


def unique(prefix: str) -> str:
    """A name no other test on this API server uses (Nodes are cluster-wide)."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}-"


@contextmanager
def open_scene(
    plane: ControlPlane,
    namespace: str,
    helm: Helm,
    directory: Path,
    *,
    components: Sequence[str] = (),
    values: Sequence[str] = (),
) -> Iterator[Scene]:
    """A scene for a fresh release in ``namespace``, ``components``' RBAC installed; closed
    (processes stopped, cluster-wide objects deleted) on the way out."""
    release = Release.render(helm, namespace, values=values)
    scene = Scene(plane=plane, release=release, directory=directory, processes=Processes(directory))
    try:
        scene.install(*components)
        yield scene
    finally:
        scene.close()
