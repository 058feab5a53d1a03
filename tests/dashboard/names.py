"""The metric names a dashboard's PromQL reads, and the names docs/metrics.md lists."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "metrics.md"
DEVICE_METRICS = frozenset(
    {
        "capwatch_gpu_healthy",
        "capwatch_gpu_faults",
        "capwatch_gpu_xid_events_total",
        "capwatch_gpu_power_draw_watts",
        "capwatch_gpu_enforced_limit_watts",
        "capwatch_gpu_throttle_reason_active",
        "capwatch_gpu_ecc_uncorrected_errors",
    }
)
# Series that appear only when their event happens (an XID's code is a label): a
# healthy node serves the family's HELP and TYPE but no sample.
EVENT_DRIVEN = frozenset({"capwatch_gpu_xid_events_total"})
HISTOGRAM_SAMPLES = ("_bucket", "_sum", "_count")
# A metric name followed by anything but "(" (a function such as capwatch_x( is none).
_NAME = re.compile(r"\b(capwatch_[a-z0-9_]+)\b(?!\s*\()")
_DOC_ROW = re.compile(r"^\|\s*`(capwatch_\w+)`\s*\|\s*([\w ()]+?)\s*\|", re.MULTILINE)


def names_in(expr: str) -> set[str]:
    """The capwatch metric names one PromQL expression reads."""
    return set(_NAME.findall(expr))


def documented() -> dict[str, str]:
    """docs/metrics.md's tables: each metric name with its type (counter, histogram, ...)."""
    return dict(_DOC_ROW.findall(DOC.read_text()))


def family(name: str, histograms: Iterable[str]) -> str:
    """The documented name a sample name belongs to: a histogram's _bucket, _sum and
    _count samples belong to the histogram; every other name is its own."""
    for suffix in HISTOGRAM_SAMPLES:
        if name.endswith(suffix) and name.removesuffix(suffix) in histograms:
            return name.removesuffix(suffix)
    return name
