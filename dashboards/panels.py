"""Panel builders shared by the dashboard's rows, over grafana-foundation-sdk's builders.

Every query reads the ``datasource`` variable; agent queries join on
``capwatch_info`` for each series' node (docs/metrics.md: only GPU series carry
labels of their own), so the ``node`` variable filters with or without the
chart's ServiceMonitor relabelling.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus, stat, statetimeline, timeseries
from grafana_foundation_sdk.builders.common import ReduceDataOptions, VizLegendOptions
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.common import (
    BigValueColorMode,
    BigValueGraphMode,
    LegendDisplayMode,
    LegendPlacement,
)

DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
# Agent series carry no node label of their own; capwatch_info does.
NODE = 'on(instance, job) group_left(node) capwatch_info{node=~"$node"}'
GPU = 'gpu=~"$gpu"'
RATE = "$__rate_interval"
# The agent's GPU legend: which node, which index.
GPU_LEGEND = "{{node}} gpu {{gpu}}"

Panel = Builder[model.Panel]


def on_node(expr: str) -> str:
    """``expr`` (agent series) with each series' node, filtered by the node variable."""
    return f"({expr}) * {NODE}"


def query(expr: str, legend: str, ref: str = "A") -> prometheus.Dataquery:
    return (
        prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)
    )


def _queries(targets: Iterable[tuple[str, str]]) -> Iterator[prometheus.Dataquery]:
    for ref, (expr, legend) in zip("ABCDEFGH", targets, strict=False):
        yield query(expr, legend, ref)


def _legend() -> VizLegendOptions:
    return (
        VizLegendOptions()
        .display_mode(LegendDisplayMode.LIST)
        .placement(LegendPlacement.BOTTOM)
        .show_legend(True)
    )


def graph(
    title: str,
    description: str,
    targets: Iterable[tuple[str, str]],
    *,
    unit: str,
    width: int = 12,
    minimum: float | None = 0,
) -> timeseries.Panel:
    """A time series panel: ``targets`` are (PromQL, legend) pairs."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(8)
        .legend(_legend())
        # Set, not left to the plugin's defaults: the JSON then decodes back unchanged.
        .line_width(1)
        .fill_opacity(10)
    )
    if minimum is not None:
        panel = panel.min(minimum)
    for target in _queries(targets):
        panel = panel.with_target(target)
    return panel


def _steps(steps: Iterable[tuple[float | None, str]]) -> dash.ThresholdsConfig:
    return (
        dash.ThresholdsConfig()
        .mode(model.ThresholdsMode.ABSOLUTE)
        .steps([model.Threshold(value=value, color=color) for value, color in steps])
    )


def figure(
    title: str,
    description: str,
    expr: str,
    *,
    steps: Iterable[tuple[float | None, str]],
    unit: str = "short",
    width: int = 6,
) -> stat.Panel:
    """A single-number stat panel coloured by ``steps`` (value it starts at, colour)."""
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(4)
        .color_mode(BigValueColorMode.BACKGROUND)
        .graph_mode(BigValueGraphMode.NONE)
        .reduce_options(ReduceDataOptions().calcs(["lastNotNull"]))
        .thresholds(_steps(steps))
        .with_target(query(expr, title))
    )


def states(
    title: str, description: str, expr: str, legend: str, *, names: Mapping[str, tuple[str, str]]
) -> statetimeline.Panel:
    """A state timeline of a 1/0 gauge; ``names`` maps each value to (text, colour)."""
    mapping = model.ValueMap(
        options={
            value: model.ValueMappingResult(text=text, color=color, index=index)
            for index, (value, (text, color)) in enumerate(names.items())
        }
    )
    return (
        statetimeline.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .span(12)
        .height(8)
        .mappings([mapping])
        .thresholds(_steps([(None, "text")]))
        .line_width(0)
        .fill_opacity(70)
        .with_target(query(expr, legend))
    )


def quantiles(metric: str) -> list[tuple[str, str]]:
    """p50 and p99 of a histogram, its buckets summed over every series first."""
    bucket = f"rate({metric}_bucket[{RATE}])"
    return [
        (f"histogram_quantile({q}, sum by (le) ({bucket}))", name)
        for q, name in (("0.5", "p50"), ("0.99", "p99"))
    ]


def agent_quantiles(metric: str) -> list[tuple[str, str]]:
    """p50 and p99 of an agent histogram, per node."""
    bucket = on_node(f"rate({metric}_bucket[{RATE}])")
    return [
        (f"histogram_quantile({q}, sum by (node, le) ({bucket}))", f"{{{{node}}}} {name}")
        for q, name in (("0.5", "p50"), ("0.99", "p99"))
    ]
