"""The figures of one bench/readyz.py run: what they are, printed, and as JSON."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

RATIO_TARGET = 0.5  # shim / baseline answered requests per second, at least
RSS_TARGET_MIB = 60  # the shim's resident memory, at most


@dataclass(frozen=True, kw_only=True)
class Load:
    """One load run's figures, from either generator."""

    answered: int  # complete answers, whatever their status
    non_200: int
    errors: dict[str, int]  # connect/read/write/timeout failures, no answer
    seconds: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    client_cpu_s: float

    @property
    def per_s(self) -> float:
        return self.answered / self.seconds


@dataclass(frozen=True, kw_only=True)
class Measured:
    load: Load
    server_cpu_s: float

    @property
    def failed(self) -> int:
        """Requests without a 200: no answer at all, or another status."""
        return sum(self.load.errors.values()) + self.load.non_200


@dataclass(frozen=True, kw_only=True)
class Figures:
    shim: Measured  # the best round by requests/s
    bare: Measured
    shim_failed: int  # requests without a 200 over every round
    rounds: tuple[tuple[Measured, Measured], ...]  # every round: (shim, bare)
    ready_kib: int  # the shim's RSS once ready, before any load
    warm_kib: int  # after the warm-up load
    after_kib: int  # after the measured load
    peak_kib: int  # VmHWM at the end
    final: str  # a probe's answer after the load
    shim_exit: int | None


def line(name: str, m: Measured) -> str:
    load = m.load
    detail = ", ".join(f"{k} {v}" for k, v in load.errors.items() if v) or "none"
    return (
        f"    {name:<21} {load.per_s:6.0f} req/s  p50 {load.p50_ms:5.1f} ms  "
        f"p99 {load.p99_ms:5.1f} ms  max {load.max_ms:5.0f} ms  non-200 {load.non_200}  "
        f"no answer: {detail}\n{'':26}CPU over the run: server {m.server_cpu_s / load.seconds:.0%},"
        f" load generator {load.client_cpu_s / load.seconds:.0%}"
    )


def report(f: Figures, args: argparse.Namespace) -> None:
    ours, bare = f.shim, f.bare
    ratio = ours.load.per_s / bare.load.per_s
    p50x, p99x = ours.load.p50_ms / bare.load.p50_ms, ours.load.p99_ms / bare.load.p99_ms
    # A shim that drops requests has not met the target, however fast the rest were.
    met = ratio >= RATIO_TARGET and f.shim_failed == 0
    dropped = "" if met else f"; {f.shim_failed} requests without a 200 over all rounds"
    print(
        f"  GET /readyz, {args.clients} clients, best of {args.rounds} alternated rounds by "
        "answered requests/s:\n"
        f"{line('capwatch shim', ours)}\n{line('bare asyncio handler', bare)}\n"
        f"    ratio shim/baseline {ratio:.2f} req/s "
        f"(latency p50 {p50x:.2f}x, p99 {p99x:.2f}x)  "
        f"[target >= {RATIO_TARGET} with every request a 200: {verdict(met)}{dropped}]\n"
        f"    a probe after the load: {f.final!r}"
    )
    worst = max(f.after_kib, f.peak_kib) / 1024
    print(
        f"  shim RSS: ready {f.ready_kib / 1024:.1f} MiB, after warm-up "
        f"{f.warm_kib / 1024:.1f} MiB, after the load {f.after_kib / 1024:.1f} MiB "
        f"(peak {f.peak_kib / 1024:.1f} MiB)  "
        f"[target <= {RSS_TARGET_MIB} MiB: {verdict(worst <= RSS_TARGET_MIB)}]"
    )


def json_figures(f: Figures, args: argparse.Namespace, generator: str) -> dict[str, Any]:
    """Every round's figures and the shim's memory, for bench/plot.py."""

    def load(m: Measured) -> dict[str, Any]:
        return {
            "req_s": round(m.load.per_s),
            "p50_ms": round(m.load.p50_ms, 2),
            "p99_ms": round(m.load.p99_ms, 2),
            "failed": m.failed,
        }

    return {
        "clients": args.clients,
        "seconds": args.seconds,
        "load_generator": generator,
        "rounds": [{"shim": load(shim), "bare": load(bare)} for shim, bare in f.rounds],
        "ratio_target": RATIO_TARGET,
        "rss_mib": {
            "ready": round(f.ready_kib / 1024, 1),
            "warm": round(f.warm_kib / 1024, 1),
            "after": round(f.after_kib / 1024, 1),
            "peak": round(f.peak_kib / 1024, 1),
        },
        "rss_target_mib": RSS_TARGET_MIB,
    }


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"
