"""The controller's metrics: series at zero from the start, scrape-time counts, and
docs/metrics.md's controller table matching what is exposed."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from capwatch.controller.conditions import AgentLink, NodeObservation, condition_of
from capwatch.controller.metrics import EVENT_RESULTS, WRITE_RESULTS, ControllerMetrics
from capwatch.controller.tracking import NodeState

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def _state(node: str, link: AgentLink) -> NodeState:
    observation = NodeObservation(node=node, link=link)
    return NodeState(observation=observation, condition=condition_of(observation, 0.0))


def _metrics(states: dict[str, NodeState], leading: bool = True) -> ControllerMetrics:
    return ControllerMetrics(
        states=lambda: states,
        leading=lambda: leading,
        shard=1,
        shards=3,
        identity="c-1_abcd",
        version="9.9.9",
    )


def _scrape(metrics: ControllerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_every_known_series_exists_at_zero_and_counts_are_read_at_scrape_time():
    """Write and Event results, the lease transitions and every status and stream state
    exist before anything happened; node and stream counts follow the tracked states."""
    states = {
        "a": _state("a", AgentLink.MISSING),
        "b": _state("b", AgentLink.UNREACHABLE),
    }
    metrics = _metrics(states, leading=False)
    found = _scrape(metrics)
    for result in WRITE_RESULTS:
        assert found[("capwatch_controller_condition_writes_total", (("result", result),))] == 0
    for result in EVENT_RESULTS:
        assert found[("capwatch_controller_events_total", (("result", result),))] == 0
    assert found[("capwatch_controller_lease_transitions_total", (("shard", "1"),))] == 0
    assert found[("capwatch_controller_nodes", (("status", "unknown"),))] == 2
    assert found[("capwatch_controller_nodes", (("status", "true"),))] == 0
    assert found[("capwatch_controller_streams", (("state", "missing"),))] == 1
    assert found[("capwatch_controller_streams", (("state", "unreachable"),))] == 1
    assert found[("capwatch_controller_streams", (("state", "connected"),))] == 0
    assert found[("capwatch_controller_leader", (("shard", "1"),))] == 0
    metrics.written(result="ok", latency_s=0.3)
    metrics.written(result="fenced", latency_s=None)
    metrics.event(result="posted")
    metrics.holder_changed()
    found = _scrape(metrics)
    assert found[("capwatch_controller_condition_writes_total", (("result", "ok"),))] == 1
    assert found[("capwatch_controller_condition_writes_total", (("result", "fenced"),))] == 1
    assert found[("capwatch_controller_detection_latency_seconds_count", ())] == 1
    assert found[("capwatch_controller_detection_latency_seconds_bucket", (("le", "0.5"),))] == 1
    assert found[("capwatch_controller_events_total", (("result", "posted"),))] == 1
    assert found[("capwatch_controller_lease_transitions_total", (("shard", "1"),))] == 1
    assert not any(name.endswith("_created") for name, _ in found)


def test_docs_list_every_controller_family_with_its_type_and_labels():
    """docs/metrics.md's controller rows are exactly the families exposed, with their types,
    and each row's label values are the ones the series carry."""
    metrics = _metrics({"a": _state("a", AgentLink.CONNECTED)})
    text = generate_latest(metrics.registry).decode()
    exposed = {f.name: f.type for f in text_string_to_metric_families(text)}
    rows = re.findall(
        r"^\| `(capwatch_controller_\w+)` \| ([\w ()]+?) \| (.*?) \|", DOC.read_text(), re.M
    )
    documented = {
        name.removesuffix("_total"): kind.split()[0]  # "gauge (info)": exposed as a gauge
        for name, kind, _ in rows
    }
    assert documented == exposed
    labels = {name.removesuffix("_total"): cell for name, _, cell in rows}
    assert set(re.findall(r"`(\w+)`", labels["capwatch_controller_condition_writes"])) == {
        "result",
        *WRITE_RESULTS,
    }
    assert set(re.findall(r"`(\w+)`", labels["capwatch_controller_events"])) == {
        "result",
        *EVENT_RESULTS,
    }
    assert set(re.findall(r"`(\w+)`", labels["capwatch_controller_streams"])) == {
        "state",
        *(link.value for link in AgentLink),
    }


def test_each_node_has_one_condition_series_until_it_leaves_the_shard():
    """capwatch_controller_node_condition is 1 for each tracked node with its current status
    and reason; a changed condition replaces the node's series, and a node no longer tracked
    (it left the shard) has none."""
    states = {
        "a": _state("a", AgentLink.MISSING),
        "b": _state("b", AgentLink.UNREACHABLE),
    }
    metrics = _metrics(states)

    def conditions() -> dict[tuple[tuple[str, str], ...], float]:
        return {
            labels: v
            for (name, labels), v in _scrape(metrics).items()
            if name == "capwatch_controller_node_condition"
        }

    assert conditions() == {
        (("node", "a"), ("reason", "AgentMissing"), ("status", "unknown")): 1.0,
        (("node", "b"), ("reason", "AgentUnreachable"), ("status", "unknown")): 1.0,
    }
    states["a"] = _state("a", AgentLink.CONNECTING)
    del states["b"]
    (only,) = conditions()
    assert dict(only)["node"] == "a"
    assert dict(only)["reason"] != "AgentMissing"
