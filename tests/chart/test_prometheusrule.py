"""The PrometheusRule: off by default, the rules file's groups when on (one source, no
drift), its values honoured, and its rules valid for promtool."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.alerts.rules import RULES, RUNBOOK_BASE, groups, promtool
from tests.chart.support import RELEASE, Helm, Manifests
from tests.chart.test_values import SCHEMA_ERROR

ON = ("--set", "prometheusRule.enabled=true")


def test_no_rule_unless_enabled(rendered: dict[str, Manifests]) -> None:
    """Only the variant that turns it on renders a PrometheusRule."""
    for name, manifests in rendered.items():
        assert bool(manifests.of_kind("PrometheusRule")) == (name == "alerts"), name


def test_rendered_groups_are_the_rules_files(helm: Helm) -> None:
    """With the defaults (release capwatch), the rendered spec is the file, group for
    group and rule for rule: the chart cannot drift from the file."""
    rule = helm.render(*ON).one("PrometheusRule")
    assert rule["spec"] == {"groups": groups()}
    assert rule["metadata"]["name"] == RELEASE


def test_another_release_changes_only_the_agents_job(helm: Helm) -> None:
    """Under another release name, only `job="capwatch"` changes, to the release's full name
    (the job its ServiceMonitor gives the agents)."""
    spec = helm.run("template", "gpu", str(RULES.parents[1]), "--namespace", "ops", *ON)
    assert spec.returncode == 0, spec.stderr
    (rule,) = [d for d in yaml.safe_load_all(spec.stdout) if d and d["kind"] == "PrometheusRule"]
    expected = yaml.safe_load(RULES.read_text().replace('job="capwatch"', 'job="gpu-capwatch"'))
    assert rule["spec"] == expected
    assert rule["spec"] != {"groups": groups()}


def test_runbook_base_and_labels_are_honoured(rendered: dict[str, Manifests]) -> None:
    """The ci/ variant's runbookBaseUrl replaces every runbook_url's base, anchors kept, and
    its labels are on the object."""
    rule = rendered["alerts"].one("PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    file_rules = [r for g in groups() for r in g["rules"]]
    rendered_rules = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    base = "https://docs.example.com/capwatch/charts/capwatch/README.md"
    for ours, theirs in zip(file_rules, rendered_rules, strict=True):
        url = ours["annotations"]["runbook_url"]
        assert theirs["annotations"]["runbook_url"] == url.replace(RUNBOOK_BASE, base)
        assert url.startswith(RUNBOOK_BASE + "#")


def test_rendered_rules_pass_promtool(rendered: dict[str, Manifests], tmp_path: Path) -> None:
    """The rendered spec is a valid rules file for promtool (the CRD's schema is not
    available offline; its content is what Prometheus loads)."""
    tool = promtool()
    spec = rendered["alerts"].one("PrometheusRule")["spec"]
    path = tmp_path / "rendered-rules.yaml"
    path.write_text(yaml.safe_dump(spec))
    done = subprocess.run(
        [tool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (("--set", "prometheusRule.enabled=yes"), "/prometheusRule/enabled"),
        (
            ("--set", "prometheusRule.runbookBaseUrl=docs/README.md"),
            "/prometheusRule/runbookBaseUrl",
        ),
        (
            ("--set", "prometheusRule.runbookBaseUrl=https://x/README.md#runbook"),
            "/prometheusRule/runbookBaseUrl",
        ),
        (("--set", "prometheusRule.label.a=b"), "label"),
    ],
)
def test_schema_rejects_bad_rule_values(helm: Helm, args: tuple[str, ...], where: str) -> None:
    """A non-boolean toggle, a base that is not an http(s) URL or carries its own anchor,
    and a misspelt key are refused, naming the key."""
    done = helm.template(*args)
    assert done.returncode != 0
    assert SCHEMA_ERROR in done.stderr
    assert where in done.stderr
