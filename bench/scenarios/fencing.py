"""The leader-pause trial on the real API server, with the fencing policy and without,
and how stale the API server's view of a Lease can be after a takeover.

Trials (tests/realkube/trials.py): a shard's two replicas follow a pool of nodes;
every node's condition changes at once, the leader is frozen (SIGSTOP) as its first
write of that burst reaches the API server, the standby takes the Lease over and
writes, the old leader is thawed. Counted from the API server's audit log: the old
leader's writes (Node status patches, Events) received after the takeover, admitted
and refused, and nodes left with a stale condition. The target with the policy: 0
admitted in every trial. Also counted, in both settings: the old leader's writes
that left the process after their deadline (received after its thaw, which is after
the takeover and so after every deadline they carried; the target: 0, since the API
client does not send a request whose deadline has passed), those on the wire when it
froze, and, from its metrics, those it dropped instead (``expired``).

The window: the Lease's holder is moved (a PUT as admin) while a replica's pod-bound
token writes a Node's status in a tight loop; from the PUT's answer to the first
refusal is how long the policy's cached copy of the Lease lagged (and the writes
admitted meanwhile).

    .venv/bin/python -m bench.scenarios.fencing [--trials 20] [--nodes 120] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.figures.results import check_writable, write_json
from bench.shared.stats import verdict
from tests.chart.support import Helm, fetch_helm
from tests.realkube.access import ApiError, BoundPod
from tests.realkube.audit import audited_plane
from tests.realkube.components import open_scene
from tests.realkube.controlplane import ControlPlane, build_kube
from tests.realkube.trials import Trial, started_pair

FENCING = ("--set", "controller.fencing.admissionPolicy=true")
NO_FENCING = ("--set", "controller.fencing.admissionPolicy=false")


def trials(
    plane: ControlPlane, helm: Helm, work: Path, *, fenced: bool, count: int, nodes: int
) -> list[Trial]:
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    plane.create_namespace(namespace)
    directory = work / namespace
    directory.mkdir()
    values = FENCING if fenced else NO_FENCING
    with open_scene(
        plane, namespace, helm, directory, components=("controller",), values=values
    ) as scene:
        if fenced:
            scene.install_fencing()
        audit = plane.directory / "audit.log"
        with started_pair(scene, audit, nodes=nodes, heartbeat_s=300) as pair:
            done = []
            for k in range(count):
                trial = pair.trial(fenced=fenced, settle_s=2.0)
                print(
                    f"  {'with' if fenced else 'without'} the policy, trial {k + 1:2}: "
                    f"old leader's writes after the takeover admitted {trial.admitted_after}, "
                    f"refused {trial.refused_after}; left after their deadline "
                    f"{trial.left_after_deadline}, on the wire at the freeze "
                    f"{trial.in_flight_at_freeze}, dropped {trial.dropped}; stale nodes "
                    f"{trial.stale}, not yet reached by the new leader {trial.behind}; "
                    f"takeover {trial.took_over_s:.1f} s",
                    flush=True,
                )
                for late in trial.late:
                    print(f"    left after its deadline: {late}", flush=True)
                if trial.stale_seen:
                    print(f"    stale nodes carried: {', '.join(trial.stale_seen)}", flush=True)
                done.append(trial)
    return done


def window(plane: ControlPlane, helm: Helm, work: Path, *, rounds: int) -> list[dict[str, float]]:
    """Per round: seconds from the Lease PUT's answer to the first refusal of the old
    holder's write, and how many of its writes were admitted meanwhile."""
    namespace = f"window-{uuid.uuid4().hex[:6]}"
    plane.create_namespace(namespace)
    directory = work / namespace
    directory.mkdir()
    out = []
    with open_scene(
        plane, namespace, helm, directory, components=("controller",), values=FENCING
    ) as scene:
        scene.install_fencing()
        node = f"window-{uuid.uuid4().hex[:6]}"
        scene.gpu_node(node)
        pods = [scene.replica_pod(r) for r in (0, 2)]  # both of shard 0
        tokens, identities = [], []
        account = scene.release.service_account("controller")
        for pod in pods:
            bound = BoundPod(pod["metadata"]["name"], pod["metadata"]["uid"])
            tokens.append(plane.token(namespace, account, pod=bound))
            identities.append(f"{bound.name}_{bound.uid}")
        leases = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        name = scene.lease_name(0)  # the Lease shard 0's policy binding reads
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name},
            "spec": {"holderIdentity": identities[0], "leaseDurationSeconds": 15},
        }
        plane.request("POST", leases, lease)
        path = f"/api/v1/nodes/{node}/status"
        body = {"status": {"conditions": [{"type": "GPUPowerCapEnforced", "$patch": "delete"}]}}

        def writes(holder: int) -> bool:
            try:
                scene.patch_as(tokens[holder], path, body)
            except ApiError as err:
                if err.status == 403:
                    return False
                raise
            return True

        holder = 0
        deadline = time.monotonic() + 30
        while not writes(holder):  # the policy has the Lease in its cache
            assert time.monotonic() < deadline, "the holder's writes are refused"
        for _ in range(rounds):
            current = plane.request("GET", f"{leases}/{name}")
            current["spec"]["holderIdentity"] = identities[1 - holder]
            plane.request("PUT", f"{leases}/{name}", current)
            moved = time.monotonic()
            admitted = 0
            while writes(holder):
                admitted += 1
                assert time.monotonic() - moved < 30, "the old holder is never refused"
            out.append({"window_s": time.monotonic() - moved, "admitted": admitted})
            holder = 1 - holder
            while not writes(holder):
                assert time.monotonic() - moved < 30, "the new holder is never admitted"
    return out


def summary(name: str, done: list[Trial]) -> dict[str, Any]:
    admitted = sum(t.admitted_after for t in done)
    refused = sum(t.refused_after for t in done)
    with_late = sum(1 for t in done if t.admitted_after)
    left = sum(t.left_after_deadline for t in done)
    applied_late = sum(t.applied_after_deadline for t in done)
    on_wire = sum(t.in_flight_at_freeze for t in done)
    dropped = None if any(t.dropped is None for t in done) else sum(t.dropped or 0 for t in done)
    print(
        f"{name}: {len(done)} trials; old leader's writes after the takeover: admitted "
        f"{admitted} (in {with_late} trials), refused {refused}; left after their deadline "
        f"{left} (in {sum(1 for t in done if t.left_after_deadline)} trials; applied "
        f"{applied_late}), on the wire at "
        f"the freeze {on_wire}, dropped {dropped}; stale nodes {sum(t.stale for t in done)}"
    )
    return {
        "trials": len(done),
        "admitted": admitted,
        "trials_with_admitted": with_late,
        "refused": refused,
        "left_after_deadline": left,
        "trials_with_left_after_deadline": sum(1 for t in done if t.left_after_deadline),
        "applied_after_deadline": applied_late,
        "in_flight_at_freeze": on_wire,
        "dropped": dropped,
        "stale": sum(t.stale for t in done),
        "takeover_s": [round(t.took_over_s, 2) for t in done],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--nodes", type=int, default=120)
    parser.add_argument("--window-rounds", type=int, default=30)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    check_writable(args.json)
    binaries = build_kube().cached_binaries()
    if binaries is None:
        print("fencing bench: the control plane is not built (make kube)", file=sys.stderr)
        return 1
    helm = Helm(binary=fetch_helm(), home=Path(tempfile.mkdtemp(prefix="capwatch-helm-")))
    with tempfile.TemporaryDirectory(prefix="capwatch-fencing-") as tmp:
        work = Path(tmp)
        with audited_plane(work / "plane", binaries) as plane:
            print(f"leader-pause trials, {args.nodes} nodes, lease 4 s / renew 3 s / retry 0.5 s")
            fenced = trials(plane, helm, work, fenced=True, count=args.trials, nodes=args.nodes)
            bare = trials(plane, helm, work, fenced=False, count=args.trials, nodes=args.nodes)
            lag = window(plane, helm, work, rounds=args.window_rounds)
    print("results")
    figures = {
        "with_policy": summary("with the policy", fenced),
        "without_policy": summary("without the policy", bare),
    }
    windows = sorted(w["window_s"] * 1000 for w in lag)
    admitted = [w["admitted"] for w in lag]
    print(
        f"the policy's window after a takeover, {len(lag)} rounds: median "
        f"{statistics.median(windows):.1f} ms, max {windows[-1]:.1f} ms; old holder's writes "
        f"admitted in it: median {statistics.median(admitted):g}, max {max(admitted)}"
    )
    figures["window_ms"] = {
        "median": round(statistics.median(windows), 1),
        "max": round(windows[-1], 1),
        "admitted_max": max(admitted),
    }
    print(f"target: 0 admitted with the policy: {verdict(figures['with_policy']['admitted'] == 0)}")
    sent_late = sum(figures[k]["left_after_deadline"] for k in ("with_policy", "without_policy"))
    print(f"target: 0 writes left after their deadline: {verdict(not sent_late)}")
    if args.json is not None:
        write_json(args.json, figures)
    with contextlib.suppress(OSError):
        helm.home.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
