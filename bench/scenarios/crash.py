"""Crash trials: ``kill -9`` the agent at random instants; no cap may escape its record.

Each trial forks a child that runs the agent's reconciler, ownership store
and sim backend, reconciling back to back, with the simulated power limits
kept in a file (:mod:`capwatch.agent.sim.limits`, the agent's ``--sim-limits-file``),
so they survive the kill as a real GPU's do. Every cycle moves every GPU to
a new owner and target, so a cap is being written at almost every instant. The parent kills
the child with SIGKILL after a random delay, then checks what a restarted
agent would find:

- **unrecorded caps**: a GPU whose limit is not its default and that the
  ownership record does not hold (nothing would ever release it);
- **unparseable records**: an ownership record the restarted agent cannot read;
- **not released**: after the restart (the same state dir and limits, the
  pods gone), one cycle must bring every GPU back to its default.

The same trials run twice: once with the pre-write save disabled (the agent
as it was: the record saved only at the end of each cycle) as the baseline
that shows the trials can see the window, and once as capwatch ships.

    .venv/bin/python -m bench.scenarios.crash [--trials 1000] [--baseline-trials 200]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.shared.stats import verdict
from capwatch.agent.attribution import Attributor, FsProcRoot
from capwatch.agent.ownership import LoadStatus, OwnershipStore, read_records
from capwatch.agent.reconciling import Policy, Reconciler
from capwatch.agent.sim.limits import PersistentLimits
from capwatch.agent.sim.scenario import parse_scenario
from capwatch.agent.sim.views import SimGpuBackend, SimPodView
from capwatch.agent.sim.world import SimWorld
from capwatch.kit.clock import SystemClock
from capwatch.kit.errors import OwnershipError

GPUS = 4
DEFAULT_W = 300
PODS = 4
# Kill between these delays after the fork (s): the child starts in a few
# milliseconds and then cycles as fast as the disk lets it save.
KILL_AFTER = (0.01, 0.25)


def _uuid(i: int) -> str:
    return f"GPU-c7a5c7a5-0000-4000-8000-{i:012x}"


def _pod_uid(i: int) -> str:
    return f"cccccccc-0000-4000-8000-{i:012x}"


SCENARIO = {
    "node_name": "crash-trial",
    "safe_default_watts": 250,
    "gpus": [
        {"uuid": _uuid(i), "min_watts": 100, "max_watts": 400, "default_watts": DEFAULT_W}
        for i in range(GPUS)
    ],
    "pods": [
        {
            "namespace": "trial",
            "name": f"p{i}",
            "uid": _pod_uid(i),
            "annotations": {"capwatch.io/gpu-power-limit": str(200 + 25 * i)},
        }
        for i in range(PODS)
    ],
}


class _Rotate:
    """A cycle listener: at cycle n, GPU g runs a process of pod (g + n) % (PODS + 1), or is
    idle when that is PODS. Every GPU gets a new target every cycle, and is released and
    claimed afresh every PODS + 1 cycles: a first claim is the window a crash can exploit."""

    def __init__(self, world: SimWorld) -> None:
        self._world = world

    def begin_cycle(self, sequence: int) -> None:
        for gpu in range(GPUS):
            pod = (gpu + sequence) % (PODS + 1)
            running = {} if pod == PODS else {1000 + 10 * gpu + pod: _pod_uid(pod)}
            self._world.set_processes(gpu, running)

    def interrupt(self) -> None:
        pass


def _reconciler(root: Path, *, busy: bool, unsafe: bool = False) -> Reconciler:
    """The agent's own parts over a world whose limits live in ``root/limits.json``.

    ``unsafe``: the baseline, with no save before each write (only at the cycle's end).
    """
    world = SimWorld(
        parse_scenario(SCENARIO, source="crash trial"),
        limits=PersistentLimits(root / "limits.json"),
    )
    world.materialise_procs(root / "proc")
    clock = SystemClock()
    store = OwnershipStore(root / "state", clock=clock)
    status = store.load()
    if unsafe:
        claim = store.claim

        def claim_without_save(**kwargs: Any) -> bool:
            claim(**kwargs)
            return False  # "unchanged": the reconciler then writes without saving first

        store.claim = claim_without_save  # type: ignore[method-assign]
    return Reconciler(
        backend=SimGpuBackend(world),
        pods=SimPodView(world),
        attributor=Attributor(FsProcRoot(root / "proc")),
        store=store,
        clock=clock,
        policy=Policy(annotation_key="capwatch.io/gpu-power-limit", safe_default_watts=250),
        initial_device_count=GPUS,
        release_unowned_idle=status is LoadStatus.UNREADABLE,
        listeners=(world, _Rotate(world)) if busy else (world,),
    )


def _child(root: Path, *, unsafe: bool) -> None:
    """Reconcile back to back until killed (never returns)."""
    reconciler = _reconciler(root, busy=True, unsafe=unsafe)
    while True:
        reconciler.reconcile_once()


@dataclass
class Tally:
    trials: int = 0
    unrecorded: int = 0
    unparseable: int = 0
    not_released: int = 0
    capped_at_kill: int = 0  # GPUs off their default when killed (the trials had work to see)
    examples: list[str] = field(default_factory=list)


def trial(root: Path, rng: random.Random, tally: Tally, *, unsafe: bool) -> None:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            _child(root, unsafe=unsafe)
        finally:
            os._exit(0)
    time.sleep(rng.uniform(*KILL_AFTER))
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    tally.trials += 1

    limits_file = root / "limits.json"
    limits = json.loads(limits_file.read_text()) if limits_file.exists() else {}
    capped = {u for u, mw in limits.items() if mw != DEFAULT_W * 1000}
    tally.capped_at_kill += len(capped)
    try:
        recorded = read_records(root / "state")
    except OwnershipError as exc:
        tally.unparseable += 1
        tally.examples.append(f"trial {tally.trials}: {exc}")
        recorded = {}
    missing = capped - set(recorded)
    if missing:
        tally.unrecorded += len(missing)
        if len(tally.examples) < 5:
            tally.examples.append(f"trial {tally.trials}: capped but unrecorded: {sorted(missing)}")

    # Restart: same state dir and limits, the pods gone. One cycle must release everything.
    _reconciler(root, busy=False).reconcile_once()
    limits = json.loads(limits_file.read_text()) if limits_file.exists() else {}
    left = {u for u, mw in limits.items() if mw != DEFAULT_W * 1000}
    if left - missing:  # an unrecorded cap cannot be released; that is counted above
        tally.not_released += len(left - missing)
        tally.examples.append(f"trial {tally.trials}: not released: {sorted(left - missing)}")
    # The next trial starts from clean hardware, as after a reset.
    limits_file.unlink(missing_ok=True)
    for leftover in (root / "state").iterdir():
        leftover.unlink()


def run_trials(trials: int, *, seed: int, unsafe: bool, workdir: Path | None = None) -> Tally:
    rng = random.Random(seed)
    tally = Tally()
    with tempfile.TemporaryDirectory(prefix="capwatch-crash-", dir=workdir) as tmp:
        root = Path(tmp)
        (root / "state").mkdir()
        for _ in range(trials):
            trial(root, rng, tally, unsafe=unsafe)
    return tally


def _line(name: str, tally: Tally, seconds: float) -> str:
    return (
        f"{name:<34} trials {tally.trials:>5}  unrecorded caps {tally.unrecorded:>4}  "
        f"unparseable records {tally.unparseable:>3}  not released {tally.not_released:>3}  "
        f"(GPUs capped at the kill: {tally.capped_at_kill}; {seconds:.0f} s)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--baseline-trials", type=int, default=200)
    args = parser.parse_args()
    print(
        f"{GPUS} GPUs, new owner and target every cycle, idle one in {PODS + 1}; SIGKILL after "
        f"{KILL_AFTER[0] * 1000:.0f}-{KILL_AFTER[1] * 1000:.0f} ms"
    )
    started = time.monotonic()
    baseline = run_trials(args.baseline_trials, seed=args.seed, unsafe=True)
    print(_line("baseline (no save before write)", baseline, time.monotonic() - started))
    started = time.monotonic()
    shipped = run_trials(args.trials, seed=args.seed, unsafe=False)
    print(_line("capwatch", shipped, time.monotonic() - started))
    for example in shipped.examples:
        print("  " + example)
    target = shipped.unrecorded == shipped.unparseable == shipped.not_released == 0
    print(f"target: 0 unrecorded, 0 unparseable, 0 not released -> {verdict(target)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
