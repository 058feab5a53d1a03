"""The chart's fencing policy on the real API server: a controller replica's Node status
writes and Events are admitted only while its shard's Lease names it
(charts/capwatch/templates/controller-fencing.yaml).

Replicas are stood in for by Pods of the chart's StatefulSet names (nothing runs them:
no kubelet here) and the pod-bound tokens TokenRequest mints for them, which is what a
controller pod's projected token is."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.chart.support import CHART, RELEASE, Helm
from tests.realkube.access import ApiError, BoundPod
from tests.realkube.controlplane import ControlPlane

CONTROLLER = f"{RELEASE}-controller"
SHARDS = 2
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
FENCED = "capwatch fencing"


@dataclass(frozen=True)
class Replica:
    pod: str
    uid: str
    token: str

    @property
    def identity(self) -> str:
        return f"{self.pod}_{self.uid}"


@dataclass
class Fenced:
    realkube: ControlPlane
    namespace: str
    replicas: list[Replica]
    node: str

    def lease(self, shard: int, holder: str) -> None:
        """Create or replace shard's Lease naming holder (as admin)."""
        path = LEASES.format(ns=self.namespace)
        name = f"{CONTROLLER}-{shard}-of-{SHARDS}"
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
        }
        try:
            current = self.realkube.request("GET", f"{path}/{name}")
        except ApiError as err:
            if err.status != 404:
                raise
            self.realkube.request("POST", path, body)
            return
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        self.realkube.request("PUT", f"{path}/{name}", body)

    def write_condition(self, replica: Replica | str) -> int:
        """PATCH the Node's status as the replica (or with a bare token); the HTTP status."""
        token = replica if isinstance(replica, str) else replica.token
        body = {"status": {"conditions": [_condition()]}}
        return self._status(f"/api/v1/nodes/{self.node}/status", body, token, "PATCH")

    def post_event(self, replica: Replica) -> int:
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{self.node}.{uuid.uuid4().hex[:10]}", "namespace": "default"},
            "involvedObject": {"kind": "Node", "name": self.node, "apiVersion": "v1"},
            "reason": "CapsEnforced",
            "message": "fencing test",
            "type": "Normal",
            "source": {"component": "capwatch-controller"},
        }
        return self._status("/api/v1/namespaces/default/events", event, replica.token, "POST")

    def _status(self, path: str, body: Any, token: str, method: str) -> int:
        try:
            self.realkube.request_text(method, path, body, token=token, content_type=_type(method))
        except ApiError as err:
            self.last_refusal = err.body
            return err.status
        return 200

    last_refusal: str = ""


def _type(method: str) -> str:
    return "application/strategic-merge-patch+json" if method == "PATCH" else "application/json"


def _condition() -> dict[str, Any]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "type": "GPUPowerCapEnforced",
        "status": "True",
        "reason": "CapsEnforced",
        "message": "fencing test",
        "lastTransitionTime": now,
        "lastHeartbeatTime": now,
    }


def eventually(check: Callable[[], bool], *, timeout: float = 10.0) -> float:
    """Seconds until check() held (the policy reads Leases from the server's cache)."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, "timed out"
        time.sleep(0.02)
    return time.monotonic() - started


@pytest.fixture
def fenced(helm: Helm, realkube: ControlPlane, realkube_namespace: str) -> Iterator[Fenced]:
    """The chart with the controller (2 shards) and its fencing policy installed; three
    replica pods (ordinals 0, 1, 2: shards 0, 1, 0) with pod-bound tokens; a GPU node."""
    ns = realkube_namespace
    done = helm.run(
        "install", RELEASE, str(CHART), "--namespace", ns,
        "--kubeconfig", str(realkube.kubeconfig),
        "--set", "controller.enabled=true", "--set", f"controller.shards={SHARDS}",
        "--set", "controller.fencing.admissionPolicy=true",
    )  # fmt: skip
    node = f"gpu-{uuid.uuid4().hex[:8]}"
    try:
        assert done.returncode == 0, done.stderr
        realkube.request(
            "POST",
            "/api/v1/nodes",
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}},
        )
        replicas = []
        for ordinal in range(3):
            name = f"{CONTROLLER}-{ordinal}"
            pod = realkube.request(
                "POST",
                f"/api/v1/namespaces/{ns}/pods",
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name},
                    "spec": {
                        "serviceAccountName": CONTROLLER,
                        "containers": [{"name": "controller", "image": "capwatch:test"}],
                    },
                },
            )
            uid = pod["metadata"]["uid"]
            token = realkube.token(ns, CONTROLLER, pod=BoundPod(name=name, uid=uid))
            replicas.append(Replica(pod=name, uid=uid, token=token))
        fenced = Fenced(realkube=realkube, namespace=ns, replicas=replicas, node=node)
        # The policy and its bindings take effect once the server's admission has them
        # (until the Leases exist, refused for want of its parameter: 422).
        unbound = realkube.token(ns, CONTROLLER)
        eventually(lambda: fenced.write_condition(unbound) != 200)
        yield fenced
    finally:
        helm.run(
            "uninstall", RELEASE, "--namespace", ns, "--no-hooks",
            "--kubeconfig", str(realkube.kubeconfig),
        )  # fmt: skip
        with contextlib.suppress(ApiError):
            realkube.request("DELETE", f"/api/v1/nodes/{node}")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_only_the_holder_of_its_shards_lease_may_write(fenced: Fenced) -> None:
    """Ordinal 0 (shard 0) holding Lease 0 writes conditions and Events; ordinal 2 (also
    shard 0) is refused 403 naming the holder; ordinal 1 (shard 1) is refused while Lease 1
    names someone else, and admitted once it names ordinal 1."""
    zero, one, two = fenced.replicas
    fenced.lease(0, zero.identity)
    fenced.lease(1, "someone-else_1234")
    eventually(lambda: fenced.write_condition(zero) == 200)
    assert fenced.post_event(zero) == 200
    assert fenced.write_condition(two) == 403
    refused = f"{FENCED}: {two.pod} does not hold Lease {CONTROLLER}-0-of-{SHARDS}"
    assert refused in fenced.last_refusal
    assert zero.identity in fenced.last_refusal
    assert fenced.post_event(two) == 403
    eventually(lambda: fenced.write_condition(one) == 403)
    fenced.lease(1, one.identity)
    eventually(lambda: fenced.write_condition(one) == 200)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_takeover_fences_the_old_holder(fenced: Fenced) -> None:
    """When Lease 0 moves from ordinal 0 to ordinal 2, ordinal 0's writes are refused
    from then on (after the server's cache has the new Lease: measured, seconds at most)
    and ordinal 2's admitted."""
    zero, _, two = fenced.replicas
    fenced.lease(0, zero.identity)
    eventually(lambda: fenced.write_condition(zero) == 200)
    fenced.lease(0, two.identity)
    window = eventually(lambda: fenced.write_condition(zero) == 403)
    assert window < 10
    assert fenced.write_condition(two) == 200


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_tokens_that_are_not_pod_bound_are_refused_and_a_shard_without_a_lease_is_open(
    fenced: Fenced,
) -> None:
    """A token of the controller's account that names no pod is refused whatever the
    Leases say. A shard whose Lease does not exist yet (no replica of it campaigned)
    neither refuses its own replicas, which are left to their client-side fence, nor
    blocks the other shards (the server resolves every binding's Lease first)."""
    zero, one, _ = fenced.replicas
    fenced.lease(0, zero.identity)
    eventually(lambda: fenced.write_condition(zero) == 200)
    unbound = fenced.realkube.token(fenced.namespace, CONTROLLER)
    assert fenced.write_condition(unbound) == 403
    assert fenced.write_condition(unbound) == 403
    assert FENCED in fenced.last_refusal
    assert fenced.write_condition(one) == 200  # no Lease capwatch-controller-1 yet


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_helm_upgrade_with_another_shard_count_keeps_one_binding_per_shard(
    helm: Helm, realkube: ControlPlane, realkube_namespace: str
) -> None:
    """Installed with 2 shards, upgraded to 3 then to 1: after each, the server holds the
    identity binding and exactly one binding per shard, each naming its own Lease."""
    base = [
        "--namespace", realkube_namespace, "--kubeconfig", str(realkube.kubeconfig),
        "--set", "controller.enabled=true",
    ]  # fmt: skip
    try:
        for verb, shards in (("install", 2), ("upgrade", 3), ("upgrade", 1)):
            done = helm.run(
                verb, RELEASE, str(CHART), *base, "--set", f"controller.shards={shards}"
            )
            assert done.returncode == 0, done.stderr
            bindings = realkube.request(
                "GET", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
            )["items"]
            ours = {
                b["metadata"]["name"]: b["spec"].get("paramRef", {}).get("name")
                for b in bindings
                if b["metadata"]["name"].startswith(f"{CONTROLLER}-fencing")
            }
            assert ours == {
                f"{CONTROLLER}-fencing": None,
                **{
                    f"{CONTROLLER}-fencing-{k}": f"{CONTROLLER}-{k}-of-{shards}"
                    for k in range(shards)
                },
            }
    finally:
        helm.run("uninstall", RELEASE, *base[:4], "--no-hooks")
