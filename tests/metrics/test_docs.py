"""docs/metrics.md against what the agent exposes: its alerts use only labels that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from capwatch.agent.podevents import EventCounts
from capwatch.server.certificates import Reloads
from capwatch.server.metrics.cycle_metrics import Metrics
from tests.server.harness import failed, ok, start_harness

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
# Labels Prometheus itself gives every scraped series.
TARGET_LABELS = frozenset({"instance", "job"})


async def exposed_labels() -> dict[str, set[str]]:
    """Each exposed sample name with the labels its series carry (every optional family on)."""
    harness = await start_harness()
    try:
        harness.publish([ok(0), failed(1), ok(2)])
        metrics = Metrics(
            publication=harness.publication,
            certificate_reloads=lambda: Reloads(loaded=0, rejected=0),
            pod_events=lambda: EventCounts(posted=0, failed=0, dropped=0),
        )
        text = generate_latest(metrics.registry).decode()
    finally:
        await harness.server.stop()
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    return labels


def alerts() -> list[dict[str, object]]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    rules = [rule for block in blocks for rule in yaml.safe_load(block) or []]
    assert rules, "docs/metrics.md has alert examples"
    return rules


@pytest.mark.asyncio
async def test_alert_examples_use_only_labels_their_metrics_have():
    """Every metric an example alert names is exposed; every label it matches on belongs to
    that metric; every $labels.X its annotations use is on the series the expression
    returns (its first metric's labels, those a group_left brings, and the target's)."""
    labels = await exposed_labels()
    for rule in alerts():
        expr = str(rule["expr"])
        names = re.findall(r"\bcapwatch_\w+", expr)
        assert names, rule
        for name in names:
            assert name in labels, f"{rule['alert']}: {name} is not exposed"
        for name, matchers in re.findall(r"\b(capwatch_\w+)\{([^}]*)\}", expr):
            used = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers))
            assert used <= labels[name], f"{rule['alert']}: {name} has no {used - labels[name]}"
        returned = labels[names[0]] | TARGET_LABELS
        for joined in re.findall(r"group_left\s*\(([^)]*)\)", expr):
            returned |= {label.strip() for label in joined.split(",") if label.strip()}
        text = yaml.safe_dump(rule.get("annotations", {}))
        for label in re.findall(r"\$labels\.(\w+)", text):
            assert label in returned, f"{rule['alert']}: $labels.{label} is not on its series"
