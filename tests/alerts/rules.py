"""The alerting rules file the chart ships, and what the tests need to read from it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tests.metrics.support import prometheus_tool

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "charts" / "capwatch" / "files"
RULES = FILES / "capwatch-rules.yaml"
RULE_TESTS = FILES / "capwatch-rules-tests.yaml"
CHART_README = ROOT / "charts" / "capwatch" / "README.md"
# Every runbook_url is this base and an anchor of a heading in the chart's README.
RUNBOOK_BASE = "charts/capwatch/README.md"

# A rule's expression ends in one comparison with a number; without it, the
# expression is the series the alert watches.
_COMPARISON = re.compile(r"\s*(?:==|!=|>=|<=|>|<)\s*-?\d+(?:\.\d+)?\s*$")
_RANGE = re.compile(r"\[(\d+)([smh])\]")
_SECONDS = {"s": 1, "m": 60, "h": 3600}


def groups() -> list[dict[str, Any]]:
    loaded: list[dict[str, Any]] = yaml.safe_load(RULES.read_text())["groups"]
    return loaded


def alerts() -> list[dict[str, Any]]:
    return [rule for group in groups() for rule in group["rules"] if "alert" in rule]


def watched(expr: str) -> str:
    """``expr`` without its final comparison; fails if it has none."""
    inner, count = _COMPARISON.subn("", expr.strip())
    assert count == 1, f"no final comparison with a number in {expr!r}"
    return inner


def scaled(expr: str, factor: int) -> str:
    """``expr`` with every range selector ``factor`` times shorter (whole seconds)."""

    def shorten(match: re.Match[str]) -> str:
        seconds = int(match[1]) * _SECONDS[match[2]]
        assert seconds % factor == 0, f"{match[0]} does not divide by {factor}"
        return f"[{seconds // factor}s]"

    return _RANGE.sub(shorten, expr)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def promtool() -> str:
    """The promtool binary (see prometheus_tool)."""
    return prometheus_tool("promtool")
