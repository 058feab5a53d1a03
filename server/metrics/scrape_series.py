"""Series Prometheus reads at scrape time, and the per-GPU cap gauges they show.

What describes *now* is computed when Prometheus scrapes, on the event loop like the
fold (:mod:`capwatch.server.metrics.cycle_metrics`): the agent's info, readiness, the
age of the last good cycle, the streams' subscribers, messages and refusals, malformed
gRPC requests, dropped device events, TLS reloads and pod Events where they are on;
and the cap gauges, from the :class:`GpuCaps` the fold keeps for each GPU
(:func:`next_caps`: the rule from one step to the next, in cycle_metrics' docstring).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)

from capwatch.agent.podevents import EventCounts
from capwatch.agent.pods import PodRef
from capwatch.agent.reports import CapSource, GpuResult, Outcome
from capwatch.server.certificates import Reloads
from capwatch.server.grpc.publication import Publication
from capwatch.server.http.exposition import ScrapeCollector


@dataclass(frozen=True, kw_only=True)
class GpuCaps:
    """What the cap gauges show for one GPU (None: NaN)."""

    uuid: str | None
    resolved_watts: int | None = None
    applied_watts: int | None = None
    # The step's one owner pod; None with no owner or several (empty labels).
    owner: PodRef | None = None
    # Where the cap came from, and the claims that asked it (namespace/name, by commas).
    source: CapSource | None = None
    claims: str = ""


def sole_owner(result: GpuResult) -> PodRef | None:
    return result.owners[0] if len(result.owners) == 1 else None


def next_caps(previous: GpuCaps | None, result: GpuResult) -> GpuCaps:
    """The gauges after one GPU step; see the module docstring for the rule."""
    uuid = result.uuid or (previous.uuid if previous else None)
    owner = sole_owner(result)
    if result.outcome is Outcome.ENFORCED:
        return GpuCaps(
            uuid=uuid,
            resolved_watts=result.resolved_watts,
            applied_watts=result.applied_watts,
            owner=owner,
            source=result.cap_source,
            claims=",".join(str(claim) for claim in result.claims),
        )
    if result.outcome is Outcome.OBSERVED:  # what it would write; nothing is in force
        return GpuCaps(
            uuid=uuid,
            resolved_watts=result.resolved_watts,
            owner=owner,
            source=result.cap_source,
            claims=",".join(str(claim) for claim in result.claims),
        )
    if result.outcome is not Outcome.FAILED:  # idle, released, left: no capwatch cap in force
        return GpuCaps(uuid=uuid)
    if previous is None or previous.uuid != uuid:  # another GPU at this index: nothing known
        return GpuCaps(uuid=uuid, resolved_watts=result.resolved_watts, owner=owner)
    if result.resolved_watts is None and not result.owners:  # failed before it knew anything
        return dataclasses.replace(previous, uuid=uuid)
    return GpuCaps(  # the cap in force is still the previous one, from its source
        uuid=uuid,
        resolved_watts=result.resolved_watts
        if result.resolved_watts is not None
        else previous.resolved_watts,
        applied_watts=previous.applied_watts,
        owner=owner,
        source=previous.source,
        claims=previous.claims,
    )


def _watts(value: int | None) -> float:
    return math.nan if value is None else float(value)


class ScrapeSeries(ScrapeCollector):
    """Series computed at scrape time (on the event loop, like the fold)."""

    def __init__(
        self,
        *,
        publication: Publication,
        caps: Callable[[], Mapping[int, GpuCaps]],
        certificate_reloads: Callable[[], Reloads | None],
        pod_events: Callable[[], EventCounts | None],
        malformed_requests: Callable[[], int],
        events_dropped: Callable[[], int],
        info: dict[str, str],
    ) -> None:
        self._pub = publication
        self._caps = caps
        self._certificate_reloads = certificate_reloads
        self._pod_events = pod_events
        self._malformed_requests = malformed_requests
        self._events_dropped = events_dropped
        self._info = info

    def families(self, *, populated: bool) -> list[Metric]:
        info = InfoMetricFamily("capwatch", "The agent serving these metrics.")
        age = GaugeMetricFamily(
            "capwatch_last_good_cycle_age_seconds",
            "Seconds since the last enforced cycle finished (NaN before the first).",
        )
        ready = GaugeMetricFamily("capwatch_ready", "1 when the agent is ready, else 0.")
        subscribers = GaugeMetricFamily(
            "capwatch_stream_subscribers", "Open Watch and DRA health streams."
        )
        messages = CounterMetricFamily(
            "capwatch_stream_messages", "Messages sent on the health streams."
        )
        refusals = CounterMetricFamily(
            "capwatch_stream_refusals",
            "Streams refused a slot (RESOURCE_EXHAUSTED): every slot open to the client "
            "taken (subscriber_limit), or its address holding its most (peer_limit).",
            labels=["reason"],
        )
        malformed = CounterMetricFamily(
            "capwatch_grpc_malformed_requests",
            "gRPC requests refused with INVALID_ARGUMENT because their bytes did not parse.",
        )
        dropped = CounterMetricFamily(
            "capwatch_gpu_events_dropped",
            "Device events (XID, ECC) the agent could not keep: more distinct GPU, kind "
            "and code keys between two cycles than it holds. Each drop is also a warning.",
        )
        labels = ["gpu", "uuid", "namespace", "pod", "source", "claim"]
        resolved = GaugeMetricFamily(
            "capwatch_gpu_resolved_cap_watts",
            "Cap the policy resolved for the GPU (NaN while capwatch holds none).",
            labels=labels,
        )
        applied = GaugeMetricFamily(
            "capwatch_gpu_applied_cap_watts",
            "Cap last written to the GPU (NaN while capwatch holds none).",
            labels=labels,
        )
        families: list[Metric] = [
            info,
            age,
            ready,
            subscribers,
            messages,
            refusals,
            malformed,
            dropped,
            resolved,
            applied,
        ]
        # Only when on: renewals on a plaintext port, or Events never posted, would
        # mean nothing.
        families += _optional_counter(
            "capwatch_grpc_tls_reloads",
            "TLS certificate files on the gRPC port taken up (loaded) or refused "
            "(rejected: the previous pair stays in service; each bad state once).",
            self._certificate_reloads(),
            populated=populated,
        )
        families += _optional_counter(
            "capwatch_pod_events",
            "Kubernetes Events on capped pods: posted, failed (the API refused or was "
            "unreachable) and dropped (the queue was full).",
            self._pod_events(),
            populated=populated,
        )
        if not populated:
            return families
        hub = self._pub.hub
        state = hub.state()
        readiness = hub.readiness(state)
        info.add_metric([], self._info)
        age.add_metric(
            [], math.nan if readiness.last_good_age_s is None else readiness.last_good_age_s
        )
        ready.add_metric([], 1.0 if readiness.ready else 0.0)
        subscribers.add_metric([], float(self._pub.subscribers))
        messages.add_metric([], float(self._pub.messages_sent))
        for reason, count in self._pub.admission.refusals.items():
            refusals.add_metric([reason.value], float(count))
        malformed.add_metric([], float(self._malformed_requests()))
        dropped.add_metric([], float(self._events_dropped()))
        for index, caps in sorted(self._caps().items()):
            owner = caps.owner
            values = [
                str(index),
                caps.uuid or "",
                owner.namespace if owner else "",
                owner.name if owner else "",
                caps.source.value if caps.source else "",
                caps.claims,
            ]
            resolved.add_metric(values, _watts(caps.resolved_watts))
            applied.add_metric(values, _watts(caps.applied_watts))
        return families


def _optional_counter(
    name: str, documentation: str, counts: Reloads | EventCounts | None, *, populated: bool
) -> list[Metric]:
    """A counter family labelled ``result`` by the fields of ``counts``; none if None."""
    if counts is None:
        return []
    family = CounterMetricFamily(name, documentation, labels=["result"])
    if populated:
        for result, count in dataclasses.asdict(counts).items():
            family.add_metric([result], float(count))
    return [family]
