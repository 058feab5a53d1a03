"""The controller's Prometheus metrics (``capwatch_controller_*``), on port 9401.

Counted as things happen: condition writes and Events by result, lease
transitions, and the detection latency -- from the end of the agent cycle
that changed a node's condition (placed on this process's monotonic clock by
the age the agent reported) to the successful write of that condition. Read
at scrape time: nodes by condition status, streams by state, whether this
replica leads its shard, and each node's current condition (one series per
node of the shard, so the count is bounded by the shard's nodes and a node
that leaves the shard is gone from the next scrape). Every series that can be
known up front exists from the start at zero.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric

from capwatch.controller.conditions import AgentLink, ConditionStatus
from capwatch.controller.tracking import NodeState
from capwatch.server.http.exposition import ScrapeCollector

# Detection within a cycle's delivery is milliseconds; a write retried after
# API errors can take seconds to a minute.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
WRITE_RESULTS = (
    "ok",
    "failed",
    "throttled",
    "conflict",
    "fenced",
    "refused",
    "expired",
    "not_found",
)
EVENT_RESULTS = ("posted", "failed", "deduplicated", "fenced", "refused", "expired")
TAINT_ACTIONS = ("create", "update", "delete")
TAINT_RESULTS = ("ok", "failed", "fenced", "refused", "expired")


class ControllerMetrics:
    """Implements the writer's, the recorder's and the elector's observers."""

    def __init__(
        self,
        *,
        states: Callable[[], Mapping[str, NodeState]],
        leading: Callable[[], bool],
        shard: int,
        shards: int,
        identity: str,
        version: str,
    ) -> None:
        # As the agent's: _created series double every counter for nothing a dashboard uses.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        r = self.registry
        self._shard = str(shard)
        self._writes = Counter(
            "capwatch_controller_condition_writes",
            "Node condition writes, by result (throttled: 429, the queue paused; conflict: "
            "another field manager owns the condition; fenced: held back, this replica did "
            "not hold its Lease; refused: the API server's fencing policy said so; expired: not "
            "sent, the fence's deadline passed before the request could go out).",
            ["result"],
            registry=r,
        )
        self._events = Counter(
            "capwatch_controller_events",
            "Events on Nodes, by result.",
            ["result"],
            registry=r,
        )
        self._transitions = Counter(
            "capwatch_controller_lease_transitions",
            "Changes of the shard Lease's holder seen by this replica.",
            ["shard"],
            registry=r,
        )
        self._fenced_out = Counter(
            "capwatch_controller_lease_refusals",
            "Times this replica stepped down because the API server's fencing policy "
            "refused one of its writes (it did not hold the shard's Lease).",
            ["shard"],
            registry=r,
        )
        self._taint_writes = Counter(
            "capwatch_controller_device_taint_writes",
            "DeviceTaintRule writes (one per faulted GPU a slice names), by action and result "
            "(as for condition writes).",
            ["action", "result"],
            registry=r,
        )
        self._taint_rules = Gauge(
            "capwatch_controller_device_taint_rules",
            "DeviceTaintRules of this shard in place, as this replica last listed or wrote them.",
            registry=r,
        )
        self._latency = Histogram(
            "capwatch_controller_detection_latency_seconds",
            "From the end of the agent cycle that changed a node's condition to its write.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        for result in WRITE_RESULTS:
            self._writes.labels(result=result)
        for result in EVENT_RESULTS:
            self._events.labels(result=result)
        for action in TAINT_ACTIONS:
            for result in TAINT_RESULTS:
                self._taint_writes.labels(action=action, result=result)
        self._transitions.labels(shard=self._shard)
        self._fenced_out.labels(shard=self._shard)
        r.register(
            _Scrape(
                states=states,
                leading=leading,
                shard=self._shard,
                info={
                    "version": version,
                    "shard": self._shard,
                    "shards": str(shards),
                    "identity": identity,
                },
            )
        )

    # --- observers -----------------------------------------------------------------------

    def written(self, *, result: str, latency_s: float | None) -> None:
        self._writes.labels(result=result).inc()
        if latency_s is not None:
            self._latency.observe(latency_s)

    def event(self, *, result: str) -> None:
        self._events.labels(result=result).inc()

    def taint_written(self, *, action: str, result: str) -> None:
        self._taint_writes.labels(action=action, result=result).inc()

    def taint_rules(self, count: int) -> None:
        self._taint_rules.set(count)

    def leading(self, leading: bool) -> None:
        pass  # read at scrape time

    def holder_changed(self) -> None:
        self._transitions.labels(shard=self._shard).inc()

    def fenced_out(self) -> None:
        self._fenced_out.labels(shard=self._shard).inc()


class _Scrape(ScrapeCollector):
    def __init__(
        self,
        *,
        states: Callable[[], Mapping[str, NodeState]],
        leading: Callable[[], bool],
        shard: str,
        info: dict[str, str],
    ) -> None:
        self._states = states
        self._leading = leading
        self._shard = shard
        self._info = info

    def families(self, *, populated: bool) -> list[Metric]:
        info = InfoMetricFamily("capwatch_controller", "The controller replica serving these.")
        nodes = GaugeMetricFamily(
            "capwatch_controller_nodes",
            "Nodes of this shard by GPUPowerCapEnforced status (as derived now).",
            labels=["status"],
        )
        streams = GaugeMetricFamily(
            "capwatch_controller_streams",
            "Nodes of this shard by the state of their agent's stream.",
            labels=["state"],
        )
        leader = GaugeMetricFamily(
            "capwatch_controller_leader",
            "1 while this replica holds its shard's Lease (or runs without one), else 0.",
            labels=["shard"],
        )
        condition = GaugeMetricFamily(
            "capwatch_controller_node_condition",
            "1 for each node of this shard, labelled with its GPUPowerCapEnforced status "
            "and reason as derived now.",
            labels=["node", "status", "reason"],
        )
        families: list[Metric] = [info, nodes, streams, leader, condition]
        if not populated:
            return families
        info.add_metric([], self._info)
        by_status = dict.fromkeys(ConditionStatus, 0)
        by_link = dict.fromkeys(AgentLink, 0)
        for node, state in sorted(self._states().items()):
            by_status[state.condition.status] += 1
            by_link[state.observation.link] += 1
            status = state.condition.status.value.lower()
            condition.add_metric([node, status, state.condition.reason.value], 1.0)
        for status, count in by_status.items():
            nodes.add_metric([status.value.lower()], float(count))
        for link, count in by_link.items():
            streams.add_metric([link.value], float(count))
        leader.add_metric([self._shard], 1.0 if self._leading() else 0.0)
        return families
