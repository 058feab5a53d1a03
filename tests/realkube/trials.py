"""The leader-pause trial on the real API server, with and without the fencing policy.

A shard's two replicas follow a pool of nodes; a trial makes every node's condition
change at once (the pool stops, or starts again), and the moment the leader's first
write of that burst reaches the API server the leader is frozen (SIGSTOP) with the
rest of its writes queued or in flight. The standby takes the Lease over and writes;
then the old leader is thawed (SIGCONT). What it sends after the takeover is a write
by a replica that no longer holds the Lease: the audit log says, for each, whether
the API server admitted it. Afterwards every node's condition must be what the new
leader wrote (nothing stale from the old one left on top). A node the new leader has
not reached yet (its streams to a pool just started reconnect with backoff) is not
stale: it is counted apart, as ``behind``, since it says how fast the new leader is,
not whether fencing held.

What left the old leader after its deadline: every write of the old leader's that
the API server received after the thaw left the process after it resumed, so after
the takeover, and the takeover comes after every deadline the old leader's writes
carried (the standby takes over lease duration after it saw the last renewal; a
write's deadline is at most renew deadline after that renewal began). The old
leader's own metrics count the writes it dropped instead (``expired``: not sent).

Used by tests/realkube/test_fencing_trials.py (a few trials) and bench/scenarios/fencing.py (20
with the policy and 20 without, and the policy's window after a takeover).
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import socket
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from tests.controller.e2e.processes import Process, wait_until
from tests.realkube.components import Scene

WRITES = {("nodes", "status", "patch"), ("events", "", "create")}
POD_NAME = "authentication.kubernetes.io/pod-name"


@dataclass(frozen=True)
class Audited:
    """One request of a controller replica, as the API server's audit log has it."""

    pod: str
    verb: str
    resource: str
    subresource: str
    code: int
    received: datetime
    done: datetime
    name: str = ""  # the object's (the Node's, for a condition write)

    @property
    def write(self) -> bool:
        return (self.resource, self.subresource, self.verb) in WRITES

    @property
    def admitted(self) -> bool:
        return 200 <= self.code < 300


def audited(path: Path, since: int, user: str) -> list[Audited]:
    """The requests ``user`` made after byte ``since`` of the audit log, completed ones."""
    if not path.exists():
        return []
    with path.open("rb") as log:
        log.seek(since)
        lines = log.read().splitlines()
    found = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        who, ref = event.get("user", {}), event.get("objectRef")
        if who.get("username") != user or not ref or event.get("stage") != "ResponseComplete":
            continue
        found.append(
            Audited(
                pod=(who.get("extra", {}).get(POD_NAME) or [""])[0],
                verb=event["verb"],
                resource=ref.get("resource", ""),
                subresource=ref.get("subresource", ""),
                code=int(event.get("responseStatus", {}).get("code", 0)),
                received=_time(event["requestReceivedTimestamp"]),
                done=_time(event["stageTimestamp"]),
                name=ref.get("name", ""),
            )
        )
    return found


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@dataclass(frozen=True)
class Trial:
    """What one trial saw: the old leader's writes the server received after the
    takeover, admitted and refused, and the nodes left with a stale condition."""

    fenced: bool
    leader: str
    admitted_after: int
    refused_after: int
    stale: int
    took_over_s: float  # from the freeze to the standby's winning Lease write
    # The old leader's writes received after its thaw: each left the process after its
    # deadline (the module docstring).
    left_after_deadline: int = 0
    # Of those, the ones the API server applied (2xx): a request whose headers left
    # late but whose body the deadline check withheld is answered 5xx, applied nowhere.
    applied_after_deadline: int = 0
    # Received between the freeze and the thaw: on the wire when the process stopped.
    in_flight_at_freeze: int = 0
    # Writes (condition patches and Events) the old leader did not send because their
    # deadline had passed, by its metrics (None: not read).
    dropped: int | None = None
    # What each write that left after its deadline was: verb, resource, answer, and when
    # it was received after the thaw.
    late: tuple[str, ...] = ()
    # The conditions the stale nodes carried, and how many of each.
    stale_seen: tuple[str, ...] = ()
    # Nodes not yet carrying the expected condition whose last write of the trial was
    # not the old leader's: the new leader had not reached them when the count was taken.
    behind: int = 0


@dataclass
class Pair:
    """Two replicas of one shard over a pool, in a scene of their own."""

    scene: Scene
    audit: Path
    nodes: list[str]
    replicas: dict[int, Process]
    pool_running: bool = True

    def leader(self) -> int:
        holder = self.scene.holder()
        for replica, process in self.replicas.items():
            if holder.startswith(f"{self._pod(replica)}_") and process.popen.poll() is None:
                return replica
        raise AssertionError(f"no replica holds the Lease (holder {holder!r})")

    def _pod(self, replica: int) -> str:
        return f"{self.scene.release.manifests.one('StatefulSet')['metadata']['name']}-{replica}"

    def expected(self) -> tuple[str, str]:
        return ("True", "CapsEnforced") if self.pool_running else ("Unknown", "AgentUnreachable")

    def wait_settled(self, timeout: float = 60.0) -> None:
        """Every node carries the condition the pool's state calls for."""
        want = self.expected()

        def settled() -> bool:
            return all(self._key(node) == want for node in self.nodes)

        wait_until(settled, timeout=timeout, what=f"every node {want}")

    def wrong(self) -> dict[str, tuple[str, str] | None]:
        """The nodes not carrying the condition the pool's state calls for, and what
        they carry instead."""
        want = self.expected()
        keys = {node: self._key(node) for node in self.nodes}
        return {node: key for node, key in keys.items() if key != want}

    def _key(self, node: str) -> tuple[str, str] | None:
        found = self.scene.condition(node)
        return None if found is None else (found["status"], found["reason"])

    def toggle_pool(self) -> None:
        if self.pool_running:
            self.scene.pools[1].popen.kill()
            self.scene.pools[1].popen.wait(10)
        else:
            self.scene.pool(self.nodes[0].rsplit("-", 1)[0] + "-", len(self.nodes))
        self.pool_running = not self.pool_running

    def trial(self, *, fenced: bool, settle_s: float) -> Trial:
        user = self.scene.release.user("controller")
        leader = self.leader()
        old, new = self._pod(leader), self._pod(1 - leader)
        mark = self.audit.stat().st_size
        self.toggle_pool()
        process = self.replicas[leader]
        dropped_before = expired_writes(process)

        def first_write() -> bool:
            return any(c.write and c.pod == old for c in audited(self.audit, mark, user))

        wait_until(first_write, timeout=30, what="the leader's first write of the burst")
        os.kill(process.popen.pid, signal.SIGSTOP)
        frozen = time.monotonic()
        frozen_at = datetime.now(UTC)
        try:
            wait_until(
                lambda: self.scene.holder().startswith(f"{new}_"), timeout=60, what="takeover"
            )
            took_over = time.monotonic() - frozen
            time.sleep(settle_s)  # the new leader writes the burst
        finally:
            resumed_at = datetime.now(UTC)  # before the signal: nothing of its is later
            os.kill(process.popen.pid, signal.SIGCONT)
        time.sleep(settle_s)  # what the old leader had queued or in flight lands, or not
        dropped_after = expired_writes(process)
        wrong = self.wrong()  # before the new leader corrects what it sees on its watch
        # Read after the conditions: every write the read saw has completed, so is logged.
        last = last_condition_writer(audited(self.audit, mark, user))
        stale = {node: key for node, key in wrong.items() if last.get(node) == old}
        found = collections.Counter(str(key) for key in stale.values())
        self.wait_settled()
        calls = audited(self.audit, mark, user)
        taken = min(
            c.done
            for c in calls
            if c.pod == new and c.resource == "leases" and c.verb == "update" and c.admitted
        )
        late = [c for c in calls if c.pod == old and c.write and c.received > taken]
        writes = [c for c in calls if c.pod == old and c.write]
        sent_late = [c for c in writes if c.received > resumed_at]
        return Trial(
            fenced=fenced,
            leader=old,
            admitted_after=sum(1 for c in late if c.admitted),
            refused_after=sum(1 for c in late if c.code == 403),
            stale=len(stale),
            took_over_s=took_over,
            left_after_deadline=len(sent_late),
            applied_after_deadline=sum(1 for c in sent_late if 200 <= c.code < 300),
            in_flight_at_freeze=sum(1 for c in writes if frozen_at < c.received <= resumed_at),
            dropped=None
            if dropped_before is None or dropped_after is None
            else dropped_after - dropped_before,
            late=tuple(
                f"{c.verb} {c.resource}{'/' + c.subresource if c.subresource else ''} "
                f"-> {c.code}, received {(c.received - resumed_at).total_seconds():.3f}s "
                f"after the thaw, answered {(c.done - c.received).total_seconds():.3f}s later"
                for c in sent_late
            ),
            stale_seen=tuple(f"{key} x{count}" for key, count in sorted(found.items())),
            behind=len(wrong) - len(stale),
        )


def last_condition_writer(calls: list[Audited]) -> dict[str, str]:
    """Per node, the pod whose admitted condition write completed last among ``calls``."""
    last: dict[str, Audited] = {}
    for call in calls:
        condition = call.resource == "nodes" and call.subresource == "status"
        if (
            condition
            and call.admitted
            and (call.name not in last or call.done >= last[call.name].done)
        ):
            last[call.name] = call
    return {node: call.pod for node, call in last.items()}


EXPIRED = re.compile(
    r'^capwatch_controller_(?:condition_writes|events)_total\{result="expired"\} (\S+)$', re.M
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def expired_writes(process: Process) -> int | None:
    """Condition writes and Events ``process`` dropped because their deadline had passed
    (its metrics; None when they cannot be read)."""
    found = re.search(r"metrics serving address=(\S+)", process.log)
    if found is None:
        return None
    try:
        with urllib.request.urlopen(f"http://{found[1]}/metrics", timeout=10) as answer:
            text = answer.read().decode()
    except OSError:
        return None
    return int(sum(float(v) for v in EXPIRED.findall(text)))


@contextmanager
def started_pair(scene: Scene, audit: Path, *, nodes: int, heartbeat_s: float) -> Iterator[Pair]:
    """``nodes`` GPU nodes with agent pods, a pool serving them, replicas 0 and 1 of the
    StatefulSet, every node True."""
    prefix = f"trial-{uuid.uuid4().hex[:6]}-"
    names = [f"{prefix}{i}" for i in range(nodes)]
    for name in names:
        scene.gpu_node(name)
        scene.agent_pod(name, scene.loopback.ip(1))
    scene.pool(prefix, nodes)
    scene.wait_cycled(names)
    # Metrics on a port of their own (the scene's default has none): what each dropped.
    replicas = {
        r: scene.controller(r, f"--metrics-port={free_port()}", heartbeat_s=heartbeat_s)
        for r in (0, 1)
    }
    pair = Pair(scene=scene, audit=audit, nodes=names, replicas=replicas)
    pair.wait_settled()
    yield pair
