"""The alerting rules: promtool's checks and unit tests, annotations, runbook links, and
metrics that exist."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from capwatch.controller.conditions import AgentLink, NodeObservation, condition_of
from capwatch.controller.metrics import ControllerMetrics
from capwatch.controller.tracking import NodeState
from tests.alerts.rules import (
    CHART_README,
    RULE_TESTS,
    RULES,
    RUNBOOK_BASE,
    alerts,
    github_anchor,
    promtool,
    scaled,
    watched,
)
from tests.metrics.test_docs import exposed_labels


def test_promtool_checks_the_rules_file():
    """`promtool check rules` accepts the file: valid PromQL, durations and templates."""
    done = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in done.stdout


def test_promtool_unit_tests_pass():
    """`promtool test rules` runs capwatch-rules-tests.yaml: every alert fires after its
    `for:`, not a step before, and not for the healthy series beside it."""
    done = subprocess.run(
        [promtool(), "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_unit_tests_catch_a_shorter_for(tmp_path):
    """The unit tests have teeth: the same tests against the rules with one `for:` shortened
    fail, naming the alert."""
    rules = RULES.read_text().replace("for: 10m", "for: 9m", 1)
    assert rules != RULES.read_text()
    (tmp_path / RULES.name).write_text(rules)
    (tmp_path / RULE_TESTS.name).write_text(RULE_TESTS.read_text())
    done = subprocess.run(
        [promtool(), "test", "rules", RULE_TESTS.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert "CapwatchReleaseDeferred" in done.stdout + done.stderr


def test_every_alert_is_tested_firing_and_not_firing():
    """Each alert of the file has, in the unit tests, a time where it fires and one where
    it does not."""
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for test in tests:
        for case in test["alert_rule_test"]:
            (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    names = {rule["alert"] for rule in alerts()}
    assert names - firing == set()
    assert names - quiet == set()


def test_every_alert_has_its_annotations_and_a_severity():
    """summary, description and runbook_url on every alert, and a severity label."""
    for rule in alerts():
        assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}, rule
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule


def test_runbook_urls_point_at_a_section_of_the_chart_readme():
    """Every runbook_url is the base and the anchor of a heading in the chart README's
    "Runbook" section named after the alert."""
    text = CHART_README.read_text()
    section = re.search(r"^## Runbook\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert section, "the chart README has no Runbook section"
    anchors = {github_anchor(h) for h in re.findall(r"^### (.+)$", section.group(1), re.M)}
    for rule in alerts():
        url = rule["annotations"]["runbook_url"]
        base, _, anchor = url.partition("#")
        assert base == RUNBOOK_BASE, url
        assert anchor == github_anchor(rule["alert"]), url
        assert anchor in anchors, f"{rule['alert']}: no Runbook heading for #{anchor}"


def _controller_names() -> set[str]:
    observation = NodeObservation(node="a", link=AgentLink.MISSING)
    metrics = ControllerMetrics(
        states=lambda: {
            "a": NodeState(observation=observation, condition=condition_of(observation, 0.0))
        },
        leading=lambda: True,
        shard=0,
        shards=1,
        identity="c-0",
        version="test",
    )
    text = generate_latest(metrics.registry).decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


@pytest.mark.asyncio
async def test_rules_name_only_metrics_that_are_exposed():
    """Every capwatch_ metric a rule names is served by the agent or the controller, with
    the labels it matches on."""
    labels = await exposed_labels()
    exposed = set(labels) | _controller_names()
    named = {name for rule in alerts() for name in re.findall(r"\bcapwatch_\w+", rule["expr"])}
    assert named - exposed == set(), named - exposed
    for rule in alerts():
        for name, matchers in re.findall(r"\b(capwatch_\w+)\{([^}]*)\}", rule["expr"]):
            if name in labels:
                used = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers))
                assert used <= labels[name], f"{rule['alert']}: {name} has no {used - labels[name]}"


def test_the_helpers_strip_and_scale_as_the_live_test_needs():
    """watched() drops exactly the final comparison; scaled() shortens every range."""
    assert watched("a * on(x) group_left(n) b == 0") == "a * on(x) group_left(n) b"
    assert watched("increase(c[5m]) > 0") == "increase(c[5m])"
    with pytest.raises(AssertionError):
        watched("up")
    assert scaled("increase(c[5m]) + rate(d[1h])", 30) == "increase(c[10s]) + rate(d[120s])"
