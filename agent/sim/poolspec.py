"""What a pool of simulated nodes is: its nodes' scenarios and its fault schedule.

A pool (``capwatch pool``) runs many logical nodes in one process, for scale
tests and demos (never on real GPUs). Every node gets a generated scenario:
``gpus`` GPUs whose UUIDs derive from the node's name (so a restarted pool
reports the same devices), one pod per GPU asking for a cap, and one process
per GPU in that pod, so every cycle writes every GPU.

Faults follow a schedule, in seconds since the pool started, each hitting a
fixed fraction of the nodes (chosen by a hash of the node's name and the
fault's place in the list, so the same nodes every run and different nodes
for different faults)::

    KIND:FRACTION@START+DURATION[/EVERY]      e.g. write_failed:0.1@60+30/300

- ``write_failed``: GPU 0's cap write fails (NVML ``NO_PERMISSION``): the
  node's cycles fail with ``write_failed`` (condition False, CapWriteFailed);
- ``hang``: the node completes no cycle (as a hung NVML call would keep it):
  its stream stays up with heartbeats and its readiness goes stale;
- ``silent``: the node's agent answers nothing: its streams are cut and new
  ones refused (UNAVAILABLE), as an agent that died or was cut off;
- ``vanish``: the node leaves the pool: its streams end and requests for it
  answer NOT_FOUND until the window ends.

A window is ``[START, START+DURATION)``, again every ``EVERY`` seconds if given.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass
from enum import Enum

from capwatch.agent.sim.scenario import GpuSpec, PodSpec, ProcessSpec, Scenario
from capwatch.kit.errors import ConfigError

_FAULT = re.compile(
    r"(?P<kind>[a-z_]+):(?P<fraction>[0-9.]+)@(?P<start>[0-9.]+)\+(?P<duration>[0-9.]+)"
    r"(?:/(?P<every>[0-9.]+))?"
)
_NAMESPACE = uuid.UUID("8b9d6c2e-6f0a-4b1e-9d3c-5a7e2f4c1b00")  # uuid5 namespace for GPUs
ANNOTATION = "capwatch.io/gpu-power-limit"
MIN_W, MAX_W, DEFAULT_W = 100, 700, 700


class PoolFaultKind(str, Enum):
    WRITE_FAILED = "write_failed"
    HANG = "hang"
    SILENT = "silent"
    VANISH = "vanish"


@dataclass(frozen=True, kw_only=True)
class PoolFault:
    kind: PoolFaultKind
    fraction: float  # of the nodes, in (0, 1]
    start_s: float
    duration_s: float
    every_s: float | None = None
    slot: int = 0  # its place in the schedule: which nodes it hits

    def active(self, elapsed_s: float) -> bool:
        """Whether a window of this fault is open ``elapsed_s`` after the pool started."""
        if elapsed_s < self.start_s:
            return False
        since = elapsed_s - self.start_s
        if self.every_s is not None:
            since %= self.every_s
        return since < self.duration_s

    def hits(self, node: str) -> bool:
        digest = hashlib.blake2b(f"{self.slot}/{node}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64 < self.fraction


def parse_fault(flag: str, text: str, *, slot: int = 0) -> PoolFault:
    """``KIND:FRACTION@START+DURATION[/EVERY]``; raises ConfigError naming ``flag``."""
    match = _FAULT.fullmatch(text.strip())
    if match is None:
        raise ConfigError(
            flag,
            "expected KIND:FRACTION@START+DURATION[/EVERY] "
            f"(e.g. write_failed:0.1@60+30/300), got {text!r}",
        )
    try:
        kind = PoolFaultKind(match["kind"])
    except ValueError:
        kinds = ", ".join(k.value for k in PoolFaultKind)
        raise ConfigError(flag, f"unknown fault {match['kind']!r} (one of {kinds})") from None
    try:
        fraction, start, duration = (float(match[k]) for k in ("fraction", "start", "duration"))
        every = float(match["every"]) if match["every"] else None
    except ValueError:
        raise ConfigError(flag, f"not a number in {text!r}") from None
    if not 0 < fraction <= 1:
        raise ConfigError(flag, f"the fraction must be in (0, 1], got {fraction:g}")
    if duration <= 0:
        raise ConfigError(flag, "the duration must be positive")
    if every is not None and every <= duration:
        raise ConfigError(flag, f"/EVERY ({every:g}s) must be longer than the duration")
    return PoolFault(
        kind=kind, fraction=fraction, start_s=start, duration_s=duration, every_s=every, slot=slot
    )


def node_names(count: int, *, prefix: str, first: int = 0) -> tuple[str, ...]:
    """``prefix`` and the number, unpadded: several pools (``first``) name one cluster."""
    return tuple(f"{prefix}{i}" for i in range(first, first + count))


def node_scenario(node: str, *, gpus: int, safe_default_watts: int = 300) -> Scenario:
    """``node``'s generated scenario: every GPU busy with its own capped pod."""
    devices = tuple(
        GpuSpec(
            uuid=f"GPU-{uuid.uuid5(_NAMESPACE, f'{node}/{i}')}",
            min_watts=MIN_W,
            max_watts=MAX_W,
            default_watts=DEFAULT_W,
        )
        for i in range(gpus)
    )
    pods = tuple(
        PodSpec(
            namespace="pool",
            name=f"{node}-job-{i}",
            uid=str(uuid.uuid5(_NAMESPACE, f"{node}/pod/{i}")),
            annotations={ANNOTATION: str(300 + 25 * (i % 8))},
        )
        for i in range(gpus)
    )
    processes = tuple(ProcessSpec(gpu=i, pid=10_000 + i, pod=pods[i].uid) for i in range(gpus))
    return Scenario(
        node_name=node,
        safe_default_watts=safe_default_watts,
        gpus=devices,
        pods=pods,
        processes=processes,
        source=f"pool node {node}",
    )
