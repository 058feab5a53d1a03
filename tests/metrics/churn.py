"""Pods churning over a node's GPUs, folded into a Metrics registry: the series it serves.

Shared by tests/metrics/test_cap_owners.py (which asserts the count stays
bounded) and bench/scenarios/cap_series.py (which prints the figures).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import generate_latest

from capwatch.agent.devices import inventory
from capwatch.agent.hub import Hub
from capwatch.agent.pods import PodRef
from capwatch.agent.reports import CapSource, CycleReport, GpuResult, Outcome, Reason
from capwatch.kit.clock import FakeClock
from capwatch.server.grpc.publication import Publication
from capwatch.server.metrics.cycle_metrics import Metrics
from capwatch.server.settings import DeviceNamerTemplate
from tests.metrics.support import samples

CAP_GAUGES = ("capwatch_gpu_resolved_cap_watts", "capwatch_gpu_applied_cap_watts")


@dataclass(frozen=True, kw_only=True)
class Churn:
    series_before: int  # every sample line the registry serves, before the first cycle
    series_after: int  # the same, after the last
    most_series: int  # the most any scrape served
    most_cap_series: int  # the most cap-gauge series any scrape served
    distinct_cap_series: int  # cap-gauge label sets ever served (what a TSDB keeps for a while)
    owners_seen: int  # pods that owned a GPU at some scrape


def _uuid(index: int) -> str:
    return f"GPU-c4c4c4c4-0000-4000-8000-{index:012d}"


def _step(index: int, cycle: int, pods: list[PodRef]) -> GpuResult:
    """GPU ``index`` in ``cycle``: every ninth step idle, every seventh shared, else one pod."""
    slot = cycle * 8 + index
    if slot % 9 == 0:
        return GpuResult(
            index=index, uuid=_uuid(index), outcome=Outcome.IDLE, reason=Reason.IDLE, message="idle"
        )
    owners = (pods[slot % len(pods)],)
    if slot % 7 == 0:
        owners += (pods[(slot + 1) % len(pods)],)
    return GpuResult(
        index=index,
        uuid=_uuid(index),
        outcome=Outcome.ENFORCED,
        reason=Reason.OK,
        message="capped",
        owners=owners,
        requested_watts=300,
        resolved_watts=300,
        applied_watts=300,
        cap_source=CapSource.ANNOTATION if len(owners) == 1 else CapSource.AGREED,
        process_count=len(owners),
    )


def churn(*, gpus: int = 8, pods: int = 110, cycles: int = 330) -> Churn:
    """Fold ``cycles`` cycles in which ``pods`` pods take turns on ``gpus`` GPUs, scraping
    after each one."""
    clock = FakeClock()
    hub = Hub(
        clock=clock,
        stale_after_s=45.0,
        devices=inventory({i: _uuid(i) for i in range(gpus)}, wall=clock.wall()),
    )
    publication = Publication(
        hub=hub,
        clock=clock,
        node_name="churn-node",
        interval_s=15.0,
        namer=DeviceNamerTemplate("gpu-{index}"),
        pool_name="churn-node",
        max_subscribers=10,
    )
    metrics = Metrics(publication=publication, version="churn")
    refs = [
        PodRef(namespace=f"team-{p % 11}", name=f"job-{p}", uid=f"uid-{p}") for p in range(pods)
    ]

    def scrape() -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        return samples(generate_latest(metrics.registry).decode())

    before = len(scrape())
    most = most_caps = 0
    distinct: set[tuple[str, frozenset[tuple[str, str]]]] = set()
    owners: set[str] = set()
    for cycle in range(1, cycles + 1):
        now = clock.monotonic()
        metrics.fold(
            CycleReport(
                sequence=cycle,
                started_wall=0.0,
                finished_wall=0.0,
                started_monotonic=now,
                finished_monotonic=now,
                gpus=tuple(_step(i, cycle, refs) for i in range(gpus)),
            )
        )
        found = scrape()
        caps = [key for key in found if key[0] in CAP_GAUGES]
        most = max(most, len(found))
        most_caps = max(most_caps, len(caps))
        distinct.update(caps)
        owners.update(dict(labels)["pod"] for _, labels in caps)
    owners.discard("")
    return Churn(
        series_before=before,
        series_after=len(scrape()),
        most_series=most,
        most_cap_series=most_caps,
        distinct_cap_series=len(distinct),
        owners_seen=len(owners),
    )
