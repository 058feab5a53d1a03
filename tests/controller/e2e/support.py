"""The end-to-end harness: the fake API server, real agents and real controllers.

Every agent and controller is the real command line in a subprocess
(:mod:`tests.controller.e2e.processes`). Agents run on simulated GPUs, each on
its own loopback address (``127.A.B.N``, A and B drawn per test so engineers
running the suite at once do not meet) and all on one port, as DaemonSet pods
share a container port on different pod IPs; the agent pods in the fake API
server carry those addresses as their podIP.

Time: the fake API server logs ``time.monotonic()`` for each request and write,
and CLOCK_MONOTONIC is one clock for every process on the machine, so server
times, the test's own instants and the controllers' fences are comparable.
"""

from __future__ import annotations

import random
import socket
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.controller.e2e.processes import CHANGE_S, START_S, Process, Processes, wait_until
from tests.fakes.kube_apiserver import FakeKubeApiServer

NAMESPACE = "capwatch"
LEASE = "capwatch-controller-0-of-1"  # the default release, one shard
CONDITION = "GPUPowerCapEnforced"
GPU_LABELS = {"nvidia.com/gpu.present": "true"}
AGENT_LABELS = {"app.kubernetes.io/name": "capwatch", "app.kubernetes.io/component": "node-agent"}
# Every controller runs short lease timings (client-go's rules, scaled down; a
# standby retries every 0.2 s, jittered up to 2.2x), so each test's fencing check
# sees renewals every 0.2 s against a 1 s renew deadline.
LEASE_S, RENEW_S, RETRY_S = 1.5, 1.0, 0.2
LEASE_FLAGS = (
    *("--lease-duration", str(LEASE_S)),
    *("--renew-deadline", str(RENEW_S)),
    *("--retry-period", str(RETRY_S)),
)
INTERVAL_S = 0.5  # the agents' cycle: staleness bound 1.5 s, slack for a loaded machine


# --- addresses ----------------------------------------------------------------------------


class Loopback:
    """Loopback addresses ``127.A.B.1``... sharing one port free on the first of them."""

    def __init__(self) -> None:
        self._prefix = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}"
        with socket.socket() as probe:
            probe.bind((self.ip(1), 0))
            self.port = int(probe.getsockname()[1])

    def ip(self, n: int) -> str:
        return f"{self._prefix}.{n}"

    def address(self, n: int) -> str:
        return f"{self.ip(n)}:{self.port}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# --- scenarios ----------------------------------------------------------------------------


def scenario(node: str, *, fail_cycles: tuple[int, int] | None = None) -> str:
    """Two GPUs, a pod capping GPU 0 at 450 W, GPU 1 idle; with ``fail_cycles`` the driver
    refuses GPU 0's cap write in those cycles (both included), as without CAP_SYS_ADMIN."""
    faults = ""
    if fail_cycles is not None:
        first, last = fail_cycles
        faults = (
            "faults:\n"
            f"  - {{op: set_limit, gpu: 0, error: no_permission, cycles: {{from: {first}, "
            f"to: {last}}}}}\n"
        )
    return (
        f"node_name: {node}\n"
        "safe_default_watts: 300\n"
        "gpus:\n"
        "  - {uuid: GPU-e2e00000-0000-4000-8000-000000000000, min_watts: 200, max_watts: 700,"
        " default_watts: 700}\n"
        "  - {uuid: GPU-e2e00000-0000-4000-8000-000000000001, min_watts: 200, max_watts: 700,"
        " default_watts: 700}\n"
        "pods:\n"
        "  - {namespace: ml, name: trainer, uid: a0000000-0000-4000-8000-0000000000e1,"
        ' annotations: {capwatch.io/gpu-power-limit: "450"}}\n'
        "processes:\n"
        "  - {gpu: 0, pid: 4101, pod: a0000000-0000-4000-8000-0000000000e1}\n" + faults
    )


# --- the cluster --------------------------------------------------------------------------


@dataclass(kw_only=True)
class Cluster:
    """One test's fake API server, kubeconfig, agents and controllers."""

    fake: FakeKubeApiServer
    directory: Path
    processes: Processes
    loopback: Loopback = field(default_factory=Loopback)
    agents: dict[str, Process] = field(default_factory=dict)

    @property
    def kubeconfig(self) -> Path:
        path = self.directory / "kubeconfig"
        if not path.exists():
            path.write_text(
                "apiVersion: v1\nkind: Config\n"
                f"clusters: [{{name: fake, cluster: {{server: '{self.fake.url}'}}}}]\n"
                "users: [{name: test, user: {}}]\n"
                "contexts: [{name: fake, context: {cluster: fake, user: test}}]\n"
                "current-context: fake\n"
            )
        return path

    def gpu_node(self, name: str, conditions: list[dict[str, Any]] | None = None) -> None:
        self.fake.add_node(name, labels=GPU_LABELS, conditions=conditions)

    def agent(
        self,
        node: str,
        n: int,
        *,
        fail_cycles: tuple[int, int] | None = None,
        extra: Sequence[str] = (),
    ) -> Process:
        """Start the agent of ``node`` on loopback address ``n`` (its pod: :meth:`pod`)."""
        path = self.directory / f"scenario-{node}-{n}.yaml"
        path.write_text(scenario(node, fail_cycles=fail_cycles))
        process = self.processes.start(
            f"agent-{node}-{n}",
            [
                "agent",
                *("--gpu-backend", "sim", "--scenario", str(path)),
                *("--interval", str(INTERVAL_S), "--metrics-port", "0"),
                *("--state-dir", str(self.directory / f"state-{node}-{n}")),
                *("--grpc-listen", self.loopback.address(n), "--node-name", node),
                *extra,
            ],
        )
        self.agents[node] = process
        return process

    def wait_cycled(self, node: str) -> Process:
        """Wait until ``node``'s agent serves and has completed its first cycle (a stream
        opened before that reads AgentStarting)."""
        agent = self.agents[node]
        agent.wait_log(r"grpc serving addresses=")
        agent.wait_log(r"cycle seq=1 ")
        return agent

    def pod(self, node: str, n: int) -> str:
        """Create the agent pod of ``node``, with podIP loopback address ``n``; its name."""
        name = f"capwatch-agent-{node}"
        self.fake.add_pod(
            NAMESPACE, name, node=node, labels=AGENT_LABELS, pod_ip=self.loopback.ip(n)
        )
        return name

    def dry_run(self, name: str, targets: dict[str, str], *extra: str) -> Process:
        """``capwatch controller --dry-run`` following ``targets`` (node -> address)."""
        path = self.directory / f"targets-{name}"
        path.write_text("".join(f"{node} {address}\n" for node, address in targets.items()))
        return self.processes.start(
            f"dry-run-{name}",
            [
                "controller",
                *("--dry-run", "--targets", str(path)),
                *("--grpc-listen", "127.0.0.1:0", "--metrics-port", "0", "--probe-port", "0"),
                *extra,
            ],
        )

    def controller(self, identity: str, *extra: str, metrics_port: int = 0) -> Process:
        """``capwatch controller`` as ``identity`` (its User-Agent names it), discovering the
        agents by their pods, with the short lease timings; ``metrics_port`` 0: none."""
        return self.processes.start(
            f"controller-{identity}",
            [
                "controller",
                *("--kubeconfig", str(self.kubeconfig), "--namespace", NAMESPACE),
                *("--identity", identity, "--agent-port", str(self.loopback.port)),
                *("--grpc-listen", "127.0.0.1:0", "--probe-port", "0"),
                *("--metrics-port", str(metrics_port)),
                *LEASE_FLAGS,
                *extra,
            ],
        )

    # --- what the API server holds -------------------------------------------------------

    def condition(self, node: str) -> dict[str, Any] | None:
        current = self.fake.node(node)
        assert current is not None, f"no node {node}"
        found = [c for c in current["status"].get("conditions", []) if c["type"] == CONDITION]
        return found[0] if found else None

    def key(self, node: str) -> tuple[str, str] | None:
        """(status, reason) of the node's condition now."""
        found = self.condition(node)
        return None if found is None else (found["status"], found["reason"])

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
            what=f"{node} {status}/{reason} (now {self.key(node)}); writes {self.writes(node)}",
        )

    def writes(self, node: str | None = None) -> list[tuple[str, str]]:
        """(status, reason) of every condition PATCH of ``node`` (or all), in order."""
        return [key for _, key in self.write_log(node)]

    def write_log(self, node: str | None = None) -> list[tuple[str, tuple[str, str]]]:
        """(User-Agent, (status, reason)) of every condition PATCH, in order."""
        found = []
        for write in self.fake.node_status_writes(node):
            for entry in write.patch.get("status", {}).get("conditions", []):
                if entry.get("type") == CONDITION and "status" in entry:
                    found.append((write.user_agent, (entry["status"], entry["reason"])))
        return found

    def events(self, node: str) -> list[tuple[str, str]]:
        """(type, reason) of every Event on ``node``, in order."""
        return [
            (e["type"], e["reason"])
            for e in self.fake.events()
            if e["involvedObject"]["name"] == node
        ]

    def wait_events(self, node: str, expected: list[tuple[str, str]]) -> None:
        """Wait for exactly ``expected`` Events on ``node`` (each is posted after its write)."""
        wait_until(
            lambda: self.events(node) == expected,
            what=f"Events {expected} on {node} (now {self.events(node)})",
        )

    def holder(self) -> str:
        lease = self.fake.lease(NAMESPACE, LEASE)
        return "" if lease is None else str(lease["spec"].get("holderIdentity") or "")

    def wait_leader(self, identity: str, *, timeout: float = START_S) -> None:
        wait_until(
            lambda: self.holder() == identity,
            timeout=timeout,
            what=f"{identity} to hold the Lease (holder now {self.holder()!r})",
        )

    def acquired_at(self, identity: str, *, after: float = 0.0) -> float:
        """Server time of the first Lease write after ``after`` that made ``identity`` holder."""
        for write in self.fake.lease_writes(NAMESPACE, LEASE):
            if write.at > after and write.holder == identity:
                return write.at
        raise AssertionError(f"{identity} never acquired the Lease after {after}")


def user_agent(identity: str) -> str:
    return f"capwatch-controller/{identity}"


def fencing_violations(fake: FakeKubeApiServer, *, renew_deadline_s: float = RENEW_S) -> list[str]:
    """Every Node status write made by a replica that did not hold the shard's Lease, or
    whose last successful renewal (server time) was older than the renew deadline."""
    found = []
    for write in fake.node_status_writes():
        state = write.lease(NAMESPACE, LEASE)
        if state is None or write.user_agent != user_agent(state.holder):
            holder = None if state is None else state.holder
            found.append(f"{write.node} by {write.user_agent} while {holder!r} held the Lease")
        elif state.renewed_by != write.user_agent:
            found.append(f"{write.node} by {write.user_agent}, renewed by {state.renewed_by}")
        elif write.at - state.renewed_at > renew_deadline_s:
            age = write.at - state.renewed_at
            found.append(f"{write.node} by {write.user_agent} {age:.3f}s after its renewal")
    return found


def lines_with(text: str, words: Iterable[str]) -> list[str]:
    return [line for line in text.splitlines() if all(w in line for w in words)]


Samples = Mapping[tuple[str, frozenset[tuple[str, str]]], float]


def scrape_text(port: int) -> str:
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def scrape(port: int) -> Samples:
    """Every sample the metrics endpoint on ``port`` serves ({} while it cannot be read)."""
    try:
        text = scrape_text(port)
    except OSError:
        return {}
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(found: Samples, name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


def history(fake: FakeKubeApiServer) -> str:
    """The Node status and Lease writes interleaved by server time (for failure messages)."""
    rows: list[tuple[float, str]] = []
    for write in fake.node_status_writes():
        state = write.lease(NAMESPACE, LEASE)
        conditions = write.patch.get("status", {}).get("conditions", [])
        what = ",".join(f"{c.get('status')}/{c.get('reason')}" for c in conditions)
        holder = None if state is None else state.holder
        rows.append(
            (write.at, f"PATCH {write.node} {what} by {write.user_agent} (holder {holder!r})")
        )
    for lease in fake.lease_writes(NAMESPACE, LEASE):
        rows.append(
            (lease.at, f"{lease.method} Lease holder={lease.holder!r} by {lease.user_agent}")
        )
    start = min((at for at, _ in rows), default=0.0)
    return "\n".join(f"{at - start:8.3f} {row}" for at, row in sorted(rows))
