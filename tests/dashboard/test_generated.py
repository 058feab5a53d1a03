"""The committed dashboard JSON: what the SDK's builders make, loadable by its models."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards.capwatch import COMMITTED, expressions
from tests.loadfile import load_module

ROOT = Path(__file__).resolve().parents[2]


def gendashboard() -> ModuleType:
    """scripts/gendashboard.py, imported as a module (scripts/ is not a package)."""
    return load_module("gendashboard", ROOT / "scripts" / "gendashboard.py")


def committed() -> dict[str, Any]:
    board: dict[str, Any] = json.loads(COMMITTED.read_text())
    return board


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in board["panels"] if p["type"] != "row"]


def test_committed_json_is_what_the_builders_produce():
    """The file in the chart is byte for byte the generator's output (make dashboard)."""
    assert COMMITTED.read_text() == gendashboard().render()


def test_check_mode_fails_on_a_stale_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    """--check exits 1 and names the file when it differs from the builders' output, and
    exits 0 once regenerated: the freshness check in make lint can fail."""
    module = gendashboard()
    stale = tmp_path / "capwatch.json"
    stale.write_text(COMMITTED.read_text().replace('"30s"', '"1m"'))
    monkeypatch.setattr(module, "OUT", stale)
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(sys, "argv", ["gendashboard.py", "--check"])
    assert module.main() == 1
    assert "capwatch.json is stale; run `make dashboard`" in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", ["gendashboard.py"])
    assert module.main() == 0
    monkeypatch.setattr(sys, "argv", ["gendashboard.py", "--check"])
    assert module.main() == 0


def test_committed_json_loads_back_through_the_sdk_models():
    """Decoded by the SDK's Dashboard model (panels and Prometheus queries included) and
    encoded again, the committed JSON comes back unchanged: nothing in it is unknown."""
    register_default_plugins()
    model = Dashboard.from_json(committed())
    again = json.loads(JSONEncoder(sort_keys=True).encode(model))
    assert again == committed()
    queries = [t for p in model.panels or [] for t in getattr(p, "targets", None) or []]
    assert [type(q).__module__ for q in queries] == [
        "grafana_foundation_sdk.models.prometheus"
    ] * len(expressions())


def test_variables_are_datasource_node_and_gpu():
    """The template variables: a Prometheus data source, and node and GPU multi-selects
    whose "All" is a regex matching everything (also series without the label)."""
    variables = {v["name"]: v for v in committed()["templating"]["list"]}
    assert list(variables) == ["datasource", "node", "gpu"]
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["node"]["query"] == "label_values(capwatch_info, node)"
    assert variables["gpu"]["query"] == "label_values(capwatch_gpu_applied_cap_watts, gpu)"
    for name in ("node", "gpu"):
        assert variables[name]["multi"]
        assert variables[name]["includeAll"]
        assert variables[name]["allValue"] == ".*"


def test_every_panel_and_query_reads_the_chosen_datasource():
    """No panel or query is bound to one Prometheus: each names ${datasource}."""
    ref = {"type": "prometheus", "uid": "${datasource}"}
    for panel in panels(committed()):
        assert panel["datasource"] == ref, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == ref, panel["title"]


def test_panels_have_unique_ids_and_fit_the_grid():
    """Every panel and row has its own id; none reaches past the 24-column grid or overlaps
    another (Grafana would move them about)."""
    board = committed()
    ids = [p["id"] for p in board["panels"]]
    assert len(set(ids)) == len(ids)
    taken: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


def test_the_issue_panels_are_there():
    """Fleet readiness, failures by reason, per-GPU caps, cycle duration, subscribers, the
    device-health and the controller panels each exist, in their rows."""
    rows: dict[str, list[str]] = {}
    current = ""
    for panel in committed()["panels"]:
        if panel["type"] == "row":
            current = panel["title"]
            rows[current] = []
        else:
            rows[current].append(panel["title"])
    assert list(rows) == [
        "Fleet",
        "Cycles",
        "Power caps",
        "Health streams",
        "Device health",
        "Controller",
    ]
    assert "Readiness by node" in rows["Fleet"]
    assert {"Cycles by result", "Failed GPU steps by reason", "Cycle duration"} <= set(
        rows["Cycles"]
    )
    assert {"Resolved cap per GPU", "Applied cap per GPU"} <= set(rows["Power caps"])
    assert "Stream subscribers" in rows["Health streams"]
    assert {"GPU health", "Active faults by kind", "XID events by code"} <= set(
        rows["Device health"]
    )
    assert {"Leaders per shard", "Nodes by condition", "Detection latency"} <= set(
        rows["Controller"]
    )


def test_expressions_reads_collapsed_rows_too():
    """expressions() (the list other tests evaluate) finds queries nested in a collapsed
    row as well as top-level ones, in order."""
    board = {
        "panels": [
            {"type": "timeseries", "targets": [{"expr": "a"}]},
            {"type": "row", "panels": [{"type": "stat", "targets": [{"expr": "b"}]}]},
        ]
    }
    assert expressions(board) == ["a", "b"]
    assert len(expressions()) == sum(len(p["targets"]) for p in panels(committed()))
