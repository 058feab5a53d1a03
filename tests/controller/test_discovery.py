"""Discovery (controller/discovery.py): the targets file, which agent pods are dialable and
at what address, and KubernetesDiscovery's view of agent pods and GPU nodes as it tells
its sink -- through real informers over in-memory collections (collections_fake.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from capwatch.controller.conditions import ConditionStatus, NodeCondition
from capwatch.controller.discovery import (
    KubernetesDiscovery,
    StaticDiscovery,
    agent_pod,
    parse_targets,
    trimmed_node,
    trimmed_pod,
)
from capwatch.controller.objects import node_condition, resource_version
from capwatch.kit.clock import SystemClock
from capwatch.kit.errors import ConfigError
from capwatch.kube.informer import WatchPolicy
from tests.controller.collections_fake import MemoryCollection

PORT = 50051
OLD, NEW = "2025-01-01T00:00:00Z", "2025-01-02T00:00:00Z"
POLICY = WatchPolicy(stale_after=60.0, backoff_initial=0.01, backoff_max=0.05)

# --- the targets file -----------------------------------------------------------------------


def targets_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "targets"
    path.write_text(text)
    return path


def test_a_targets_file_with_comments_and_blank_lines(tmp_path: Path) -> None:
    """NODE ADDRESS per line; blank lines, whole-line and trailing comments and any
    whitespace are ignored; host:port, [v6]:port and unix:///path are addresses."""
    path = targets_file(
        tmp_path,
        "# the lab's nodes\n"
        "\n"
        "gpu-1 10.0.0.1:50051\n"
        "   gpu-2\t\tagent-2.lab.example:50051   # behind DNS\n"
        "gpu-3.rack-1 [fd00::3]:50051\n"
        "gpu-4 unix:///run/capwatch/agent.sock\n"
        "   \t \n"
        "# the end\n",
    )
    assert parse_targets(path) == {
        "gpu-1": "10.0.0.1:50051",
        "gpu-2": "agent-2.lab.example:50051",
        "gpu-3.rack-1": "[fd00::3]:50051",
        "gpu-4": "unix:///run/capwatch/agent.sock",
    }


@pytest.mark.parametrize("text", ["", "\n\n", "# none yet\n   # nor here\n"])
def test_a_targets_file_without_targets_is_a_config_error(tmp_path: Path, text: str) -> None:
    """Empty, blank or only comments: a ConfigError for --targets naming the file (read
    once at start, it would leave the controller following nothing for its whole life)."""
    path = targets_file(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        parse_targets(path)
    assert caught.value.option == "--targets"
    assert str(caught.value) == f"--targets: {path} lists no agents (one 'NODE ADDRESS' per line)"


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        ("gpu-1", "expected 'NODE ADDRESS'"),
        ("gpu-1 10.0.0.1:50051 extra", "expected 'NODE ADDRESS'"),
        ("GPU-1 10.0.0.1:50051", "not a valid node name"),
        ("gpu_1 10.0.0.1:50051", "not a valid node name"),
        ("-gpu-1 10.0.0.1:50051", "not a valid node name"),
        ("gpu-1. 10.0.0.1:50051", "not a valid node name"),
        (f"{'a' * 254} 10.0.0.1:50051", "not a valid node name"),
        ("gpu-1 10.0.0.1", "expected host:port or unix:///path"),
        ("gpu-1 10.0.0.1:65536", "expected host:port or unix:///path"),
        ("gpu-1 http://10.0.0.1:50051", "expected host:port or unix:///path"),
        ("gpu-1 unix:relative.sock", "expected host:port or unix:///path"),
        ("gpu-1 10.0.0.1:port", "expected host:port or unix:///path"),
    ],
)
def test_a_bad_line_is_a_config_error_naming_file_and_line(
    tmp_path: Path, line: str, complaint: str
) -> None:
    """A malformed line is a ConfigError for --targets that names FILE:LINE and says why."""
    path = targets_file(tmp_path, f"# header\ngpu-0 10.0.0.9:50051\n{line}\n")
    with pytest.raises(ConfigError) as caught:
        parse_targets(path)
    assert caught.value.option == "--targets"
    assert caught.value.reason.startswith(f"{path}:3: ")
    assert complaint in caught.value.reason


@pytest.mark.parametrize("address", [":50051", "10.0.0.1:0", "unix:///"])
def test_an_address_nothing_can_dial_is_refused(tmp_path: Path, address: str) -> None:
    """An empty host (gRPC: "host must not be empty"), port 0 or a socket path of "/" is
    a typo to report at start, not a node that is unreachable for ever."""
    path = targets_file(tmp_path, f"gpu-1 {address}\n")
    with pytest.raises(ConfigError, match=r":1: expected host:port or unix:///path"):
        parse_targets(path)


def test_a_node_listed_twice_is_refused_at_its_second_line(tmp_path: Path) -> None:
    """Duplicates name the line of the repeat."""
    path = targets_file(tmp_path, "gpu-1 10.0.0.1:50051\n\ngpu-1 10.0.0.2:50051\n")
    with pytest.raises(ConfigError, match=rf"{path}:3: node 'gpu-1' is listed twice"):
        parse_targets(path)


def test_a_253_character_node_name_is_fine(tmp_path: Path) -> None:
    """The DNS subdomain limit itself is accepted."""
    name = ".".join(["a" * 63] * 4)[:253].rstrip(".")
    assert len(name) <= 253
    assert parse_targets(targets_file(tmp_path, f"{name} 10.0.0.1:50051\n")) == {
        name: "10.0.0.1:50051"
    }


@pytest.mark.parametrize("kind", ["missing", "directory", "binary"])
def test_an_unreadable_targets_file_is_a_config_error(tmp_path: Path, kind: str) -> None:
    """A missing file, a directory, or bytes that are not UTF-8: 'cannot read' the file."""
    path = tmp_path / "targets"
    if kind == "directory":
        path.mkdir()
    elif kind == "binary":
        path.write_bytes(b"gpu-1 \xff\xfe:50051\n")
    with pytest.raises(ConfigError, match=r"--targets: cannot read .*targets"):
        parse_targets(path)


# --- agent pods -----------------------------------------------------------------------------


def pod(
    uid: str,
    *,
    node: str | None = "gpu-1",
    ip: str | None = "10.1.0.1",
    created: str = OLD,
    phase: str = "Running",
    deleting: bool = False,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "uid": uid,
        "name": f"capwatch-agent-{uid}",
        "namespace": "capwatch",
        "creationTimestamp": created,
    }
    if deleting:
        metadata["deletionTimestamp"] = NEW
    return {
        "metadata": metadata,
        "spec": {} if node is None else {"nodeName": node},
        "status": {"phase": phase, **({} if ip is None else {"podIP": ip})},
    }


def test_a_running_pod_is_dialled_at_its_ip_and_the_agent_port() -> None:
    """A scheduled pod with an IP is its node's agent at IP:port."""
    uid, target = agent_pod(pod("u1", created=NEW), port=PORT)
    assert uid == "u1"
    assert target is not None
    assert (target.node, target.address, target.created) == ("gpu-1", "10.1.0.1:50051", NEW)


def test_an_ipv6_pod_is_dialled_in_brackets() -> None:
    """IPv6 pod IPs are written [ip]:port, as gRPC targets need."""
    _, target = agent_pod(pod("u1", ip="fd00:10:244::5"), port=PORT)
    assert target is not None
    assert target.address == "[fd00:10:244::5]:50051"


@pytest.mark.parametrize(
    "obj",
    [
        pod("u1", ip=None),  # not yet given an IP
        pod("u1", ip=""),
        pod("u1", node=None),  # not scheduled
        pod("u1", deleting=True),  # terminating
        pod("u1", phase="Succeeded"),
        pod("u1", phase="Failed"),
        pod("u1", ip="not-an-ip"),
    ],
)
def test_a_pod_that_cannot_be_dialled_is_no_target(obj: dict[str, Any]) -> None:
    """No IP, no node, terminating, finished, or an unusable IP: not a target (its uid is
    still returned, so a pod that stops being dialable is dropped)."""
    assert agent_pod(obj, port=PORT) == ("u1", None)


@pytest.mark.parametrize(
    "obj",
    [
        pod("u1", created=NEW),
        pod("u2", ip="fd00:10:244::5"),
        pod("u3", ip=None),
        pod("u4", node=None),
        pod("u5", deleting=True),
        pod("u6", phase="Succeeded"),
        {"metadata": None, "spec": [], "status": "x"},
    ],
)
def test_a_trimmed_pod_is_the_same_target_as_the_whole_pod(obj: dict[str, Any]) -> None:
    """What discovery keeps of an agent pod (trimmed_pod) gives the same target, or the
    same None, as the whole pod: nothing agent_pod reads is cut, the rest is."""
    whole = {
        **obj,
        "metadata": {**(obj.get("metadata") or {}), "managedFields": [{"manager": "kubelet"}]},
    }
    assert agent_pod(trimmed_pod(whole), port=PORT) == agent_pod(whole, port=PORT)
    assert "managedFields" not in trimmed_pod(whole)["metadata"]


def test_a_trimmed_node_keeps_its_name_version_and_capwatchs_condition_only() -> None:
    """trimmed_node: the Node's name, resourceVersion and GPUPowerCapEnforced, nothing of
    its images, capacity, managedFields or other conditions; what node_condition and
    resource_version read of it is what they read of the whole Node."""
    whole = gpu_node_obj("gpu-1", status="False", reason="CapWriteFailed")
    whole["metadata"]["resourceVersion"] = "4242"
    whole["metadata"]["managedFields"] = [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]
    whole["status"]["images"] = [{"names": [f"registry/image-{i}"]} for i in range(50)]
    whole["status"]["capacity"] = {"nvidia.com/gpu": "8"}
    trimmed = trimmed_node(whole)
    assert trimmed == {
        "metadata": {"name": "gpu-1", "resourceVersion": "4242"},
        "status": {"conditions": [whole["status"]["conditions"][1]]},
    }
    assert node_condition(trimmed) == node_condition(whole)
    assert resource_version(trimmed) == resource_version(whole) == 4242


def test_a_pod_without_metadata_is_no_target() -> None:
    """Whatever JSON comes, agent_pod does not raise."""
    assert agent_pod({}, port=PORT) == ("", None)
    assert agent_pod({"metadata": None, "spec": [], "status": "x"}, port=PORT) == ("", None)


# --- KubernetesDiscovery --------------------------------------------------------------------


class Sink:
    """A DiscoverySink keeping every call and the current view."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.targets: dict[str, str] = {}
        self.gpu_nodes: dict[str, NodeCondition | None] = {}
        self.versions: dict[str, int | None] = {}

    def target(self, node: str, address: str | None) -> None:
        self.calls.append(("target", node, address))
        if address is None:
            self.targets.pop(node, None)
        else:
            self.targets[node] = address

    def gpu_node(
        self,
        node: str,
        *,
        present: bool,
        condition: NodeCondition | None,
        version: int | None = None,
    ) -> None:
        self.calls.append(("gpu_node", node, present, condition))
        self.versions[node] = version
        if present:
            self.gpu_nodes[node] = condition
        else:
            self.gpu_nodes.pop(node, None)


def gpu_node_obj(name: str, *, status: str | None = None, reason: str = "") -> dict[str, Any]:
    conditions: list[dict[str, Any]] = [{"type": "Ready", "status": "True"}]
    if status is not None:
        conditions.append(
            {
                "type": "GPUPowerCapEnforced",
                "status": status,
                "reason": reason,
                "message": "from the API",
                "lastTransitionTime": "2025-06-15T15:00:00Z",
                "lastHeartbeatTime": "2025-06-15T15:05:00Z",
            }
        )
    return {"metadata": {"uid": f"node-{name}", "name": name}, "status": {"conditions": conditions}}


async def until(check: Callable[[], bool], what: str) -> None:
    """Wait (on the real loop) for the informers' threads to deliver."""
    deadline = time.monotonic() + 10
    while True:
        # Yield first: what the informer threads handed over (call_soon_threadsafe) runs.
        await asyncio.sleep(0.01)
        if check():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")


class Cluster:
    def __init__(
        self,
        pods: list[dict[str, Any]] | None = None,
        nodes: Sequence[dict[str, Any]] = (),
        *,
        static: dict[str, str] | None = None,
    ) -> None:
        self.pods = MemoryCollection(pods or [])
        self.nodes = MemoryCollection(nodes)
        self.sink = Sink()
        self.discovery_follows_pods = static is None
        self.discovery = KubernetesDiscovery(
            pods=None if static is not None else self.pods,
            nodes=self.nodes,
            static_targets=static,
            agent_port=PORT,
            policy=POLICY,
            clock=SystemClock(),
        )

    async def start(self) -> Cluster:
        self.discovery.start(self.sink)
        await until(lambda: self.discovery.sync_problem() is None, "discovery to sync")
        await until(lambda: self.nodes.watching > 0, "the node watch")
        if self.discovery_follows_pods:
            await until(lambda: self.pods.watching > 0, "the pod watch")
        return self

    def target_calls(self) -> list[tuple[Any, ...]]:
        return [c for c in self.sink.calls if c[0] == "target"]


@pytest.mark.asyncio(loop_factories=["real"])
async def test_listed_agent_pods_and_gpu_nodes_reach_the_sink() -> None:
    """After the first lists: one target per dialable agent pod, and every GPU node with
    the condition it carries (parsed), or None when it has none."""
    cluster = Cluster(
        pods=[pod("u1"), pod("u2", node="gpu-2", ip="10.1.0.2"), pod("u3", node="gpu-3", ip=None)],
        nodes=[
            gpu_node_obj("gpu-1", status="False", reason="CapWriteFailed"),
            gpu_node_obj("gpu-4"),
        ],
    )
    await cluster.start()
    try:
        await until(lambda: len(cluster.sink.gpu_nodes) == 2, "the GPU nodes")
        assert cluster.sink.targets == {"gpu-1": "10.1.0.1:50051", "gpu-2": "10.1.0.2:50051"}
        carried = cluster.sink.gpu_nodes["gpu-1"]
        assert carried is not None
        assert (carried.status, carried.reason) == (ConditionStatus.FALSE, "CapWriteFailed")
        assert carried.last_heartbeat_wall - carried.last_transition_wall == 300
        assert cluster.sink.gpu_nodes["gpu-4"] is None
    finally:
        cluster.discovery.close()


@pytest.mark.asyncio(loop_factories=["real"])
async def test_agent_pods_coming_moving_and_going() -> None:
    """A new pod is a new target, a new IP a new address, a pod deleted or terminating
    takes its node's target away; an update that changes no address tells the sink
    nothing."""
    cluster = await Cluster(pods=[pod("u1")]).start()
    try:
        cluster.pods.emit("ADDED", pod("u2", node="gpu-2", ip="10.1.0.2"))
        await until(lambda: "gpu-2" in cluster.sink.targets, "gpu-2's agent")
        cluster.pods.emit("MODIFIED", pod("u2", node="gpu-2", ip="10.1.0.2"))
        cluster.pods.emit("MODIFIED", pod("u1", ip="10.1.0.9"))
        await until(lambda: cluster.sink.targets.get("gpu-1") == "10.1.0.9:50051", "the move")
        cluster.pods.emit("MODIFIED", pod("u2", node="gpu-2", ip="10.1.0.2", deleting=True))
        await until(lambda: "gpu-2" not in cluster.sink.targets, "gpu-2's agent to go")
        cluster.pods.emit("DELETED", pod("u1", ip="10.1.0.9"))
        await until(lambda: cluster.sink.targets == {}, "gpu-1's agent to go")
        assert cluster.target_calls() == [
            ("target", "gpu-1", "10.1.0.1:50051"),
            ("target", "gpu-2", "10.1.0.2:50051"),
            ("target", "gpu-1", "10.1.0.9:50051"),
            ("target", "gpu-2", None),
            ("target", "gpu-1", None),
        ]
    finally:
        cluster.discovery.close()


@pytest.mark.asyncio(loop_factories=["real"])
async def test_the_newest_pod_on_a_node_is_its_agent() -> None:
    """With two agent pods on one node (an update replacing one), the newer is followed;
    an older one appearing changes nothing; when the newer goes, the older is followed."""
    cluster = await Cluster(pods=[pod("old", ip="10.1.0.1", created=OLD)]).start()
    try:
        cluster.pods.emit("ADDED", pod("new", ip="10.1.0.2", created=NEW))
        await until(lambda: cluster.sink.targets.get("gpu-1") == "10.1.0.2:50051", "the new pod")
        cluster.pods.emit("ADDED", pod("older", ip="10.1.0.3", created="2024-12-31T00:00:00Z"))
        cluster.pods.emit("DELETED", pod("new", ip="10.1.0.2", created=NEW))
        await until(lambda: cluster.sink.targets.get("gpu-1") == "10.1.0.1:50051", "the fallback")
        assert cluster.target_calls() == [
            ("target", "gpu-1", "10.1.0.1:50051"),
            ("target", "gpu-1", "10.1.0.2:50051"),
            ("target", "gpu-1", "10.1.0.1:50051"),
        ]
    finally:
        cluster.discovery.close()


@pytest.mark.asyncio(loop_factories=["real"])
async def test_a_relist_drops_the_pods_and_nodes_that_went_unseen() -> None:
    """After a 410 Gone the informers relist: agents and GPU nodes deleted meanwhile
    (their events lost to compaction) are told to the sink as gone."""
    cluster = await Cluster(
        pods=[pod("u1"), pod("u2", node="gpu-2", ip="10.1.0.2")],
        nodes=[gpu_node_obj("gpu-1"), gpu_node_obj("gpu-2")],
    ).start()
    try:
        await until(lambda: len(cluster.sink.gpu_nodes) == 2, "the GPU nodes")
        cluster.pods.silently(pod("u2", node="gpu-2", ip="10.1.0.2"), delete=True)
        cluster.nodes.silently(gpu_node_obj("gpu-2"), delete=True)
        cluster.pods.expire()
        cluster.nodes.expire()
        await until(lambda: cluster.sink.targets == {"gpu-1": "10.1.0.1:50051"}, "the relist")
        await until(lambda: list(cluster.sink.gpu_nodes) == ["gpu-1"], "the node relist")
        assert ("gpu_node", "gpu-2", False, None) in cluster.sink.calls
    finally:
        cluster.discovery.close()


@pytest.mark.asyncio(loop_factories=["real"])
async def test_gpu_nodes_coming_changing_and_going() -> None:
    """The node watch: a new GPU node, a change of the condition it carries, its deletion
    (present False, no condition)."""
    cluster = await Cluster(pods=[]).start()
    try:
        cluster.nodes.emit("ADDED", gpu_node_obj("gpu-7"))
        cluster.nodes.emit("MODIFIED", gpu_node_obj("gpu-7", status="True", reason="CapsEnforced"))
        cluster.nodes.emit("DELETED", gpu_node_obj("gpu-7", status="True", reason="CapsEnforced"))
        await until(lambda: len(cluster.sink.calls) == 3, "three node events")
        (added, modified, deleted) = cluster.sink.calls
        assert added == ("gpu_node", "gpu-7", True, None)
        assert modified[:3] == ("gpu_node", "gpu-7", True)
        assert modified[3].status is ConditionStatus.TRUE
        assert deleted == ("gpu_node", "gpu-7", False, None)
    finally:
        cluster.discovery.close()


@pytest.mark.asyncio(loop_factories=["real"])
async def test_each_node_reaches_the_sink_with_its_resource_version() -> None:
    """Listed and watched Nodes alike come with the resourceVersion the server gave them,
    as an integer (the writer's staleness check): a later change, a higher one."""
    cluster = await Cluster(pods=[], nodes=[gpu_node_obj("gpu-1")]).start()
    try:
        await until(lambda: "gpu-1" in cluster.sink.versions, "the listed node")
        listed = cluster.sink.versions["gpu-1"]
        cluster.nodes.emit("MODIFIED", gpu_node_obj("gpu-1", status="True", reason="CapsEnforced"))
        await until(lambda: cluster.sink.versions["gpu-1"] != listed, "the watched change")
        watched = cluster.sink.versions["gpu-1"]
        assert listed is not None
        assert watched is not None
        assert watched > listed
    finally:
        cluster.discovery.close()


@pytest.mark.asyncio(loop_factories=["real"])
async def test_static_targets_with_the_node_watch() -> None:
    """With a targets file inside a cluster, the agents are the file's and the GPU nodes
    are still watched (so a node missing from the file reads AgentMissing)."""
    cluster = Cluster(nodes=[gpu_node_obj("gpu-1"), gpu_node_obj("gpu-9")], static={"gpu-1": "a:1"})
    await cluster.start()
    try:
        await until(lambda: len(cluster.sink.gpu_nodes) == 2, "the GPU nodes")
        assert cluster.sink.targets == {"gpu-1": "a:1"}
    finally:
        cluster.discovery.close()


def test_discovery_needs_pods_or_static_targets_not_both() -> None:
    """Exactly one source of agents."""
    nodes = MemoryCollection()
    for pods, static in ((None, None), (MemoryCollection(), {"gpu-1": "a:1"})):
        with pytest.raises(ValueError, match="not both"):
            KubernetesDiscovery(
                pods=pods,
                nodes=nodes,
                static_targets=static,
                agent_port=PORT,
                policy=POLICY,
                clock=SystemClock(),
            )


def test_discovery_is_not_in_sync_before_it_starts() -> None:
    """sync_problem() says so before start()."""
    discovery = KubernetesDiscovery(
        pods=MemoryCollection(),
        nodes=MemoryCollection(),
        agent_port=PORT,
        policy=POLICY,
        clock=SystemClock(),
    )
    assert discovery.sync_problem() == "not started"


def test_static_discovery_tells_every_target_in_order() -> None:
    """The targets file's agents, sorted by node, and always in sync."""
    sink = Sink()
    static = StaticDiscovery({"gpu-2": "b:1", "gpu-1": "a:1"})
    static.start(sink)
    assert sink.calls == [("target", "gpu-1", "a:1"), ("target", "gpu-2", "b:1")]
    assert static.sync_problem() is None
    static.close()
