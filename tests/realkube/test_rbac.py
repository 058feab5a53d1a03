"""Every component under the chart's RBAC, proven on a real API server with an audit log.

The rendered ServiceAccounts, ClusterRoles, ClusterRoleBindings, Roles and RoleBindings
are applied in the test's namespace (the release namespace); each component runs with a
TokenRequest token of its own ServiceAccount, never as admin, and the audit log says
what it called and what the authorizer answered.

- **Sufficient**: with exactly the rendered rules each component does its whole job
  (the agent caps as a pod's annotation asks and as a DRA ResourceClaim asks, the claim
  allocated by the real kube-scheduler from the node's ResourceSlice, and posts Events;
  the controller leads, writes the condition, posts an Event; the cleanup hook removes
  the condition) and no call of it is refused.
- **Tight**: every single grant (verb x resource of each rule) is used by some call.
- **Necessary**: each used grant taken away in turn (its rule split, everything else
  kept), some real call of the component gets 403 for exactly that verb and resource.

Nothing here lists the rules: they are read from the render, and the server is the proof.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from capwatch.controller.taints import DeviceTaint, Effect, TaintPolicy, rule_object
from tests.chart.support import Helm
from tests.controller.e2e.processes import START_S, Process, wait_until
from tests.fakenvml.control import FakeConfig, FakeDevice, QueuedEvent
from tests.realkube.agentrun import CAP_W, CLAIM_W, AgentRun, start_agent
from tests.realkube.audit import AuditLog, Call, audited_plane
from tests.realkube.chart import Grant, apply, wait_authorized
from tests.realkube.components import Scene, open_scene, unique
from tests.realkube.controlplane import ControlPlane
from tests.realkube.dra import GPU_DRIVER, RESOURCE, gpu_uuid, publish_slice

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

GRACE_S = 1.5  # after a component has done everything else: time for a late 403
NEW_CAP_W = CAP_W + 20
NAMESPACED = ("--set", "rbac.namespaced=true")
VARIANTS = pytest.mark.parametrize("values", [(), NAMESPACED], ids=["cluster", "namespaced"])


@pytest.fixture(scope="module")
def plane(
    realkube_binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """A control plane of this module's own, auditing every request, with kube-scheduler
    (its DRA plugin allocates the agent's claims)."""
    with audited_plane(tmp_path_factory.mktemp("audited"), realkube_binaries) as started:
        started.start_scheduler()
        yield started


@pytest.fixture
def audit(plane: ControlPlane) -> AuditLog:
    return AuditLog(plane.directory / "audit.log")


@contextmanager
def _scene(
    plane: ControlPlane,
    helm: Helm,
    directory: Path,
    *components: str,
    values: Sequence[str] = (),
) -> Iterator[Scene]:
    namespace = unique("rbac").rstrip("-")
    plane.create_namespace(namespace)
    try:
        with open_scene(
            plane, namespace, helm, directory, components=components, values=values
        ) as scene:
            yield scene
    finally:
        plane.delete_namespace(namespace)


def _used(calls: Sequence[Call], grants: Sequence[Grant]) -> list[Grant]:
    """The grants some allowed call needed."""
    return [g for g in grants if any(c.covered_by(g) and c.code < 400 for c in calls)]


def _denied(calls: Sequence[Call]) -> list[Call]:
    return [c for c in calls if c.code == 403]


def _removal_rounds(
    scene: Scene,
    component: str,
    grants: Sequence[Grant],
    run: Callable[[Grant], list[Call]],
) -> dict[Grant, list[Call]]:
    """For each grant: apply the component's RBAC without it (wait until the authorizer
    agrees), run the component, and keep the 403s it got."""
    user, objects = scene.release.user(component), scene.release.objects(component)
    refused = {}
    for grant in grants:
        apply(scene.plane, objects, without=grant)
        others = [g for g in scene.release.grants(component) if g != grant]
        wait_authorized(scene.plane, user, allow=others, deny=[grant])
        refused[grant] = _denied(run(grant))
    apply(scene.plane, objects)
    return refused


def _assert_each_needed(refused: dict[Grant, list[Call]]) -> None:
    unneeded = {
        str(grant): [str(c) for c in calls]
        for grant, calls in refused.items()
        if not any(c.covered_by(grant) for c in calls)
    }
    assert unneeded == {}, "taken away, these grants got no 403 for what they allow"


# --- the controller ----------------------------------------------------------------------


AGENT_ADDRESS = 7  # the loopback address the round's agent listens on (its pod IP)
TAINT_VALUES = (
    "--set", "agent.faultRecoverySeconds=3",
    "--set", "controller.deviceTaints.holdDownSeconds=1",
)  # fmt: skip


LEGACY_CONDITION = {
    "type": "GPUPowerCapEnforced",
    "status": "True",
    "reason": "CapsEnforced",
    "message": "written by a strategic-merge patch",
    "lastTransitionTime": "2026-12-01T00:00:00Z",
    "lastHeartbeatTime": "2026-12-01T00:00:00Z",
}


def _faulted_agent(scene: Scene, node: str) -> Process:
    """The node's driver slice (two GPUs), a rule of the release already on gpu-0 with
    another effect (as a former leader left it), and the node's agent, found through its
    pod, on a fake NVML with an XID queued on each GPU (cleared 3 s later)."""
    made = scene.plane.request("GET", f"/api/v1/nodes/{node}")
    devices = {f"gpu-{i}": gpu_uuid(node[-8:], i) for i in range(2)}
    scene.paths.append(publish_slice(scene.plane, made, devices))
    stale = rule_object(
        DeviceTaint(
            node=node, index=0, uuid=devices["gpu-0"], driver=GPU_DRIVER, pool=node,
            device="gpu-0", category="xid", effect=Effect.NO_SCHEDULE, faults=("XID 79",),
        ),
        TaintPolicy(release=scene.release.name),
    )  # fmt: skip
    made_rule = scene.plane.request("POST", f"{RESOURCE}/devicetaintrules", stale)
    scene.paths.append(f"{RESOURCE}/devicetaintrules/{made_rule['metadata']['name']}")
    pod = scene.agent_pod(node, scene.loopback.ip(AGENT_ADDRESS))
    directory = scene.directory / f"agent-{node}"
    (directory / "proc").mkdir(parents=True)
    config = FakeConfig(
        devices=tuple(FakeDevice(uuid=uuid) for uuid in devices.values()),
        events=(QueuedEvent(index=0, data=79), QueuedEvent(index=1, data=79)),
    ).write(directory / "fake-nvml.conf")
    return scene.agent(
        pod,
        kubeconfig=scene.plane.kubeconfig,  # the agent's RBAC is not what this round tests
        nvml_config=config,
        proc_root=directory / "proc",
        listen=scene.loopback.address(AGENT_ADDRESS),
    )


def _controller_round(scene: Scene, audit: AuditLog, removed: Grant | None = None) -> list[Call]:
    """A fresh start (no Lease yet) with two GPU nodes of its own: one without an agent
    (carrying the condition from before server-side apply, so its first apply is refused
    and the writer reads who owns it), one whose agent reports an XID on each GPU its
    driver's slice names, then their recovery. The controller creates and renews the
    Lease, writes the conditions, posts the Events, lists the release's DeviceTaintRules,
    applies the one a former leader left and the new one, and deletes both after the
    hold-down. Ends once that is all done, or once ``removed`` was refused."""
    user = scene.release.user("controller")
    path = f"/apis/coordination.k8s.io/v1/namespaces/{scene.namespace}/leases/{scene.lease_name()}"
    scene.delete(path)
    missing, faulted = unique("gpu") + "0", unique("gpu") + "1"
    # The node without an agent carries the condition as a capwatch from before
    # server-side apply left it: the apply is refused and the owners read (get nodes).
    scene.gpu_node(missing, conditions=[LEGACY_CONDITION])
    scene.gpu_node(faulted)
    agent = _faulted_agent(scene, faulted)
    mark = audit.mark()
    process = scene.controller(0)
    grants = scene.release.grants("controller")

    def finished() -> bool:
        for proc in (process, agent):
            if proc.popen.poll() is not None:
                raise AssertionError(f"{proc.name} exited:\n{proc.log[-3000:]}")
        calls = audit.calls(user=user, since=mark)
        if removed is not None:
            # Until the call that grant allows is refused (a rule's delete comes only
            # after the recovery and the hold-down).
            return any(c.covered_by(removed) and c.code == 403 for c in calls)
        return set(_used(calls, grants)) >= set(grants)

    try:
        wait_until(finished, timeout=START_S, what=f"the controller's calls (without {removed})")
        time.sleep(GRACE_S)
    finally:
        for proc in (process, agent):
            proc.popen.terminate()
            proc.wait(timeout=30)
        for node in (missing, faulted):
            scene.delete(f"/api/v1/nodes/{node}")
        ours = f"app.kubernetes.io/instance={scene.release.name}"
        listed = scene.plane.request("GET", f"{RESOURCE}/devicetaintrules?labelSelector={ours}")
        for rule in listed["items"]:
            scene.delete(f"{RESOURCE}/devicetaintrules/{rule['metadata']['name']}")
    return audit.calls(user=user, since=mark)


def test_controller_does_its_job_with_exactly_the_rendered_rbac(
    plane: ControlPlane, helm: Helm, tmp_path: Path, audit: AuditLog
) -> None:
    """As its own ServiceAccount under the rendered ClusterRole and Role only, the
    controller takes the Lease, renews it, writes the conditions, posts the Events and
    keeps the DeviceTaintRules of a faulted node (list, apply, delete) with no
    call refused, and every grant of both roles is used by some call of it."""
    with _scene(plane, helm, tmp_path, "controller", values=TAINT_VALUES) as scene:
        calls = _controller_round(scene, audit)
        grants = scene.release.grants("controller")
    assert _denied(calls) == []
    assert all(any(c.covered_by(g) for g in grants) for c in calls if c.code < 400)
    assert _used(calls, grants) == grants


def test_each_controller_grant_is_needed(
    plane: ControlPlane, helm: Helm, tmp_path: Path, audit: AuditLog
) -> None:
    """Each single grant of the controller's ClusterRole and Role taken away in turn: some
    real call of the controller (a lease read, create or renewal, the node or pod list or
    watch, the status patch, the Event, a DeviceTaintRule's list, apply (patch, and
    create for a new one) or delete) is refused with 403 for exactly that grant."""
    with _scene(plane, helm, tmp_path, "controller", values=TAINT_VALUES) as scene:
        grants = scene.release.grants("controller")
        refused = _removal_rounds(
            scene, "controller", grants, lambda g: _controller_round(scene, audit, g)
        )
    _assert_each_needed(refused)


# --- the cleanup hook --------------------------------------------------------------------


def _cleanup_round(scene: Scene, audit: AuditLog) -> tuple[int, list[Call]]:
    """``capwatch controller cleanup`` (the Job's args) with one node carrying the
    condition and one DeviceTaintRule of the release."""
    node = unique("gpu") + "0"
    scene.gpu_node(
        node,
        conditions=[
            {
                "type": "GPUPowerCapEnforced",
                "status": "True",
                "reason": "CapsEnforced",
                "message": "written by capwatch",
                "lastTransitionTime": "2025-03-01T10:00:00Z",
                "lastHeartbeatTime": "2025-03-01T10:00:00Z",
            }
        ],
    )
    rule = rule_object(
        DeviceTaint(
            node=node, index=0, uuid="GPU-0", driver=GPU_DRIVER, pool=node, device="gpu-0",
            category="xid", effect=Effect.NONE, faults=("XID 79",),
        ),
        TaintPolicy(release=scene.release.name),
    )  # fmt: skip
    name = scene.plane.request("POST", f"{RESOURCE}/devicetaintrules", rule)["metadata"]["name"]
    mark = audit.mark()
    done = scene.cleanup()
    calls = audit.calls(user=scene.release.user("cleanup"), since=mark)
    if done.returncode == 0:
        assert scene.condition(node) is None
        assert name not in {
            r["metadata"]["name"]
            for r in scene.plane.request("GET", f"{RESOURCE}/devicetaintrules")["items"]
        }
    else:
        scene.delete(f"{RESOURCE}/devicetaintrules/{name}")
    scene.delete(f"/api/v1/nodes/{node}")
    return done.returncode, calls


def test_cleanup_does_its_job_with_exactly_the_rendered_rbac(
    plane: ControlPlane, helm: Helm, tmp_path: Path, audit: AuditLog
) -> None:
    """As the hook's ServiceAccount under the hook's ClusterRole only, the cleanup removes
    the condition and the release's DeviceTaintRule with no call refused, and uses each
    grant of that role."""
    with _scene(plane, helm, tmp_path, "cleanup") as scene:
        code, calls = _cleanup_round(scene, audit)
        grants = scene.release.grants("cleanup")
    assert code == 0
    assert _denied(calls) == []
    assert _used(calls, grants) == grants


def test_each_cleanup_grant_is_needed(
    plane: ControlPlane, helm: Helm, tmp_path: Path, audit: AuditLog
) -> None:
    """Each grant of the hook's ClusterRole taken away: the cleanup exits 1 and the call
    that grant allows (the node list, the status patch, the rules' list or delete) got
    403."""
    with _scene(plane, helm, tmp_path, "cleanup") as scene:
        codes: list[int] = []

        def run(_: Grant) -> list[Call]:
            code, calls = _cleanup_round(scene, audit)
            codes.append(code)
            return calls

        refused = _removal_rounds(scene, "cleanup", scene.release.grants("cleanup"), run)
    _assert_each_needed(refused)
    assert codes == [1] * len(codes)


# --- the agent ---------------------------------------------------------------------------


def _agent_round(
    scene: Scene, audit: AuditLog, removed: Grant | None = None
) -> tuple[AgentRun, list[Call]]:
    """The agent of a fresh node, capping one workload pod by its annotation and one GPU
    by the ResourceClaim the scheduler allocated it: ends once it has listed the pods
    and slices, read the claim, written both caps, posted its Event, written the new cap a
    re-annotation asked for (the watch brings it), cycled ten times more and renewed a
    watch at least once; or once ``removed`` was refused."""
    user = scene.release.user("agent")
    mark = audit.mark()
    # Owned by its DaemonSet: the shutdown's reads are part of the job (no controller
    # manager runs here to act on the DaemonSet).
    run = start_agent(scene, claim=True, owned=True)
    done_at: list[int] = []

    def finished() -> bool:
        if run.process.popen.poll() is not None:
            raise AssertionError(f"the agent exited:\n{run.process.log[-3000:]}")
        calls = audit.calls(user=user, since=mark)
        if removed is not None and any(c.covered_by(removed) and c.code == 403 for c in calls):
            return True
        if CAP_W * 1000 not in run.writes() or not run.events():
            return False
        if CLAIM_W * 1000 not in run.claim_writes():
            return False
        if not done_at:
            run.annotate(NEW_CAP_W)
            done_at.append(len(run.cycles()))
        if NEW_CAP_W * 1000 not in run.writes():
            return False
        watches = [c for c in calls if c.verb == "watch" and c.code < 400]
        return len(run.cycles()) >= done_at[0] + 10 and len(watches) >= 3

    try:
        wait_until(finished, timeout=START_S, what=f"the agent's job (without {removed})")
        time.sleep(GRACE_S)
    finally:
        run.process.popen.terminate()
        run.process.wait(timeout=30)
    return run, audit.calls(user=user, since=mark)


@pytest.mark.nvml
@VARIANTS
def test_agent_does_its_job_with_exactly_the_rendered_rbac(
    plane: ControlPlane,
    helm: Helm,
    tmp_path: Path,
    audit: AuditLog,
    fake_nvml_library: Path,
    values: tuple[str, ...],
) -> None:
    """As the agent's ServiceAccount (its token bound to its pod) under the rendered
    ClusterRole, or the Role of rbac.namespaced (and its ClusterRole for ResourceSlices,
    which are cluster-scoped): the agent lists the pods on its node and its node's
    ResourceSlices once each, then only watches them, reads the pod's ResourceClaim by
    name (never a list of claims), caps the workload's
    GPU as its annotation asks (and as it asks again, through the watch) and the claimed
    GPU, which no process uses, as its claim asks, posts the Event on the workload pod,
    and no call of it is refused."""
    with _scene(plane, helm, tmp_path, "agent", values=values) as scene:
        run, calls = _agent_round(scene, audit)
        grants = scene.release.grants("agent")
        events = run.events()
    assert _denied(calls) == []
    assert all(any(c.covered_by(g) for g in grants) for c in calls)
    writes = run.writes()  # the last one is the default restored at SIGTERM
    assert CAP_W * 1000 in writes
    assert writes.index(NEW_CAP_W * 1000) > writes.index(CAP_W * 1000)
    assert run.claim_writes()[0] == CLAIM_W * 1000
    # One Event per thing said: the first cap, then the new one.
    assert [(e["type"], e["reason"]) for e in events] == [("Normal", "PowerCapApplied")] * 2
    assert sum(f"{NEW_CAP_W} W" in e["message"] for e in events) == 1, events
    lists = sorted(c.resource for c in calls if c.verb == "list")
    watches = [c for c in calls if c.verb == "watch"]
    # No LIST per cycle, nor per watch: one of each kind in all; claims by name only.
    assert lists == ["pods", "resourceslices"], [str(c) for c in calls]
    assert all(c.resource != "resourceclaims" for c in watches)
    claim_reads = [c for c in calls if c.resource == "resourceclaims"]
    assert {c.verb for c in claim_reads} == {"get"}
    assert len(watches) >= 3
    assert run.enforced_cycles() >= 10


@pytest.mark.nvml
@VARIANTS
def test_agent_uses_every_rendered_grant(
    plane: ControlPlane,
    helm: Helm,
    tmp_path: Path,
    audit: AuditLog,
    fake_nvml_library: Path,
    values: tuple[str, ...],
) -> None:
    """Every single grant of the agent's rendered ClusterRole (or, with rbac.namespaced, of
    its Role and its ResourceSlice ClusterRole) is used by some call of the agent's whole
    job: the chart grants it nothing it does not do."""
    with _scene(plane, helm, tmp_path, "agent", values=values) as scene:
        _, calls = _agent_round(scene, audit)
        grants = scene.release.grants("agent")
    assert [str(g) for g in grants if g not in _used(calls, grants)] == []


@pytest.mark.nvml
@VARIANTS
def test_each_agent_grant_it_uses_is_needed(
    plane: ControlPlane,
    helm: Helm,
    tmp_path: Path,
    audit: AuditLog,
    fake_nvml_library: Path,
    values: tuple[str, ...],
) -> None:
    """Each grant the agent's whole job was seen to use (list and watch of pods and of
    resourceslices, get of resourceclaims, create of events, as the audit says, not as
    written here), taken away in turn, under the ClusterRole and under rbac.namespaced's
    two roles: some real call of the agent gets 403 for exactly that grant."""
    with _scene(plane, helm, tmp_path, "agent", values=values) as scene:
        _, calls = _agent_round(scene, audit)
        used = _used(calls, scene.release.grants("agent"))
        assert used, "the agent used none of its grants"
        refused = _removal_rounds(scene, "agent", used, lambda g: _agent_round(scene, audit, g)[1])
    _assert_each_needed(refused)
