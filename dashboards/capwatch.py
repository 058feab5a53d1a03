"""The capwatch Grafana dashboard, built with grafana-foundation-sdk's typed builders.

Fleet readiness, cycles and their failures, per-GPU caps and power, the health
streams, device health and the cluster controller, with datasource, node and
GPU variables. ``scripts/gendashboard.py`` writes ``build()`` to
``charts/capwatch/dashboards/capwatch.json``; ``expressions()`` reads every
panel's PromQL back out of that JSON, for the tests that evaluate them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import dashboard as model

from dashboards.panels import (
    DATASOURCE,
    GPU,
    GPU_LEGEND,
    RATE,
    Panel,
    agent_quantiles,
    figure,
    graph,
    on_node,
    quantiles,
    states,
)

UID = "capwatch"
TITLE = "capwatch"
# The committed JSON, inside the chart so that .Files.Get can read it.
COMMITTED = (
    Path(__file__).resolve().parent.parent / "charts" / "capwatch" / "dashboards" / "capwatch.json"
)


# --- the rows ---------------------------------------------------------------------------


def fleet() -> list[Panel]:
    ready = on_node("capwatch_ready")
    return [
        figure(
            "Agents ready",
            "Agents whose last cycle was enforced and is younger than 3 x interval.",
            f"sum({ready})",
            steps=[(None, "blue")],
        ),
        figure(
            "Agents not ready",
            "Agents scraped whose capwatch_ready is 0: not enforcing, or not for long enough.",
            f"count({ready}) - sum({ready})",
            steps=[(None, "green"), (1, "red")],
        ),
        figure(
            "Oldest good cycle",
            "The longest time any agent has gone without an enforced cycle.",
            f"max({on_node('capwatch_last_good_cycle_age_seconds')})",
            steps=[(None, "green"), (60, "orange"), (300, "red")],
            unit="s",
        ),
        figure(
            "Ownership saves failing",
            "Agents whose ownership record has not been saved for one cycle or more.",
            f"count({on_node('capwatch_ownership_unsaved_cycles')} > 0) or vector(0)",
            steps=[(None, "green"), (1, "red")],
        ),
        states(
            "Readiness by node",
            "capwatch_ready of each agent: the same rule as the pod's readiness probe.",
            f"max by (node) ({ready})",
            "{{node}}",
            names={"1": ("ready", "green"), "0": ("not ready", "red")},
        ),
        graph(
            "Age of the last good cycle",
            "Seconds since each agent's last enforced cycle (NaN before the first).",
            [(f"max by (node) ({on_node('capwatch_last_good_cycle_age_seconds')})", "{{node}}")],
            unit="s",
        ),
    ]


def cycles() -> list[Panel]:
    return [
        graph(
            "Cycles by result",
            "Completed reconcile cycles per second: enforced, failed, aborted.",
            [
                (
                    f"sum by (result) ({on_node(f'rate(capwatch_cycles_total[{RATE}])')})",
                    "{{result}}",
                )
            ],
            unit="ops",
        ),
        graph(
            "Failed GPU steps by reason",
            "Failed GPU steps per second by stable reason code (write_failed, ...).",
            [
                (
                    "sum by (reason) ("
                    + on_node(f"rate(capwatch_apply_failures_total{{{GPU}}}[{RATE}])")
                    + ")",
                    "{{reason}}",
                )
            ],
            unit="ops",
        ),
        graph(
            "Cycle duration",
            "p50 and p99 of each agent's cycle (a hung NVML call shows in the top buckets).",
            agent_quantiles("capwatch_cycle_duration_seconds"),
            unit="s",
        ),
        graph(
            "NVML errors by class",
            "Failed GPU steps that carry an NVML error class, per second.",
            [
                (
                    "sum by (error_class) ("
                    + on_node(f"rate(capwatch_gpu_errors_total{{{GPU}}}[{RATE}])")
                    + ")",
                    "{{error_class}}",
                )
            ],
            unit="ops",
        ),
        graph(
            "Cap policy fallbacks",
            "GPU steps capped at the safe default (by cause) and caps moved into range.",
            [
                (
                    f"sum by (cause) ({on_node(f'rate(capwatch_safe_default_total[{RATE}])')})",
                    "safe default: {{cause}}",
                ),
                (
                    f"sum by (direction) ({on_node(f'rate(capwatch_clamped_total[{RATE}])')})",
                    "clamped: {{direction}}",
                ),
            ],
            unit="ops",
        ),
        graph(
            "Cycles without a pod view",
            "Cycles that enforced nothing because the pod view was not synced.",
            [
                (
                    f"sum by (node) ({on_node(f'rate(capwatch_pod_view_failures_total[{RATE}])')})",
                    "{{node}}",
                )
            ],
            unit="ops",
        ),
    ]


def caps() -> list[Panel]:
    def per_gpu(metric: str) -> list[tuple[str, str]]:
        return [(on_node(f"{metric}{{{GPU}}}"), GPU_LEGEND)]

    return [
        graph(
            "Resolved cap per GPU",
            "The cap the policy resolved from the pods' requests (capwatch.io/gpu-power-limit"
            " annotations, which are not a metric); empty while capwatch holds no cap.",
            per_gpu("capwatch_gpu_resolved_cap_watts"),
            unit="watt",
            minimum=None,
        ),
        graph(
            "Applied cap per GPU",
            "The cap last written through NVML; a failed write keeps the last value.",
            per_gpu("capwatch_gpu_applied_cap_watts"),
            unit="watt",
            minimum=None,
        ),
        graph(
            "Enforced limit per GPU",
            "The power limit the driver enforces now, as NVML reports it.",
            per_gpu("capwatch_gpu_enforced_limit_watts"),
            unit="watt",
            minimum=None,
        ),
        graph(
            "Power draw per GPU",
            "Each GPU's power draw, as NVML reports it.",
            per_gpu("capwatch_gpu_power_draw_watts"),
            unit="watt",
        ),
    ]


def streams() -> list[Panel]:
    return [
        graph(
            "Stream subscribers",
            "Open Watch and DRA health streams on each agent.",
            [(f"sum by (node) ({on_node('capwatch_stream_subscribers')})", "{{node}}")],
            unit="short",
        ),
        graph(
            "Stream messages and refusals",
            "Messages sent on the health streams, and streams refused a slot, per second.",
            [
                (
                    f"sum by (node) ({on_node(f'rate(capwatch_stream_messages_total[{RATE}])')})",
                    "{{node}} sent",
                ),
                (
                    "sum by (reason) ("
                    + on_node(f"rate(capwatch_stream_refusals_total[{RATE}])")
                    + ")",
                    "refused: {{reason}}",
                ),
            ],
            unit="ops",
        ),
    ]


def devices() -> list[Panel]:
    healthy = on_node(f"capwatch_gpu_healthy{{{GPU}}}")
    red_from_one = [(None, "green"), (1, "red")]
    return [
        figure(
            "Unhealthy GPUs",
            "GPUs with an active device fault or a failed step.",
            f"count({healthy}) - sum({healthy})",
            steps=red_from_one,
        ),
        figure(
            "Active faults",
            "Active device faults on the GPUs shown, every kind.",
            f"sum({on_node(f'capwatch_gpu_faults{{{GPU}}}')})",
            steps=red_from_one,
        ),
        figure(
            "GPUs held at the power cap",
            "GPUs whose clocks the driver is holding down to stay under the power limit.",
            "sum("
            + on_node(f'capwatch_gpu_throttle_reason_active{{{GPU},reason="sw_power_cap"}}')
            + ")",
            steps=[(None, "blue")],
        ),
        figure(
            "Uncorrected ECC errors",
            "The volatile uncorrected ECC count, summed over the GPUs shown.",
            f"sum({on_node(f'capwatch_gpu_ecc_uncorrected_errors{{{GPU}}}')})",
            steps=red_from_one,
        ),
        states(
            "GPU health",
            "capwatch_gpu_healthy of each GPU: 0 while a fault is active or a step failed.",
            healthy,
            GPU_LEGEND,
            names={"1": ("healthy", "green"), "0": ("unhealthy", "red")},
        ),
        graph(
            "Active faults by kind",
            "Active device faults: xid, gpu_lost, ecc_uncorrected, row_remap_failure.",
            [(f"sum by (kind) ({on_node(f'capwatch_gpu_faults{{{GPU}}}')})", "{{kind}}")],
            unit="short",
        ),
        graph(
            "XID events by code",
            "XID events seen per second, ignored codes included (series appear with the first).",
            [
                (
                    "sum by (code) ("
                    + on_node(f"rate(capwatch_gpu_xid_events_total{{{GPU}}}[{RATE}])")
                    + ")",
                    "xid {{code}}",
                )
            ],
            unit="ops",
        ),
        graph(
            "Active throttle reasons",
            "GPUs with each clock throttle reason active.",
            [
                (
                    "sum by (reason) ("
                    + on_node(f"capwatch_gpu_throttle_reason_active{{{GPU}}}")
                    + ")",
                    "{{reason}}",
                )
            ],
            unit="short",
        ),
        graph(
            "Uncorrected ECC errors",
            "The volatile uncorrected ECC count of each GPU.",
            [(on_node(f"capwatch_gpu_ecc_uncorrected_errors{{{GPU}}}"), GPU_LEGEND)],
            unit="short",
        ),
    ]


def controller() -> list[Panel]:
    # Every replica of a shard derives the same counts; the leader's are the ones written.
    leader = "and on(instance, job) capwatch_controller_leader == 1"
    return [
        graph(
            "Leaders per shard",
            "Replicas holding each shard's Lease: 1 in steady state, 0 while it changes hands.",
            [("sum by (shard) (capwatch_controller_leader)", "shard {{shard}}")],
            unit="short",
        ),
        graph(
            "Nodes by condition",
            "GPUPowerCapEnforced as the shard leaders derive it now.",
            [(f"sum by (status) (capwatch_controller_nodes {leader})", "{{status}}")],
            unit="short",
        ),
        graph(
            "Agent streams by state",
            "The leaders' streams to their agents (missing: no agent for a GPU node).",
            [(f"sum by (state) (capwatch_controller_streams {leader})", "{{state}}")],
            unit="short",
        ),
        graph(
            "Condition writes by result",
            "Node condition writes per second: ok, failed, fenced, not_found.",
            [
                (
                    f"sum by (result) (rate(capwatch_controller_condition_writes_total[{RATE}]))",
                    "{{result}}",
                ),
                (
                    f"sum by (result) (rate(capwatch_controller_events_total[{RATE}]))",
                    "event {{result}}",
                ),
            ],
            unit="ops",
        ),
        graph(
            "Detection latency",
            "From the end of the agent cycle that changed a node's condition to its write.",
            quantiles("capwatch_controller_detection_latency_seconds"),
            unit="s",
        ),
        graph(
            "Lease transitions",
            "Changes of each shard Lease's holder seen by the replicas.",
            [
                (
                    "max by (shard) (increase("
                    f"capwatch_controller_lease_transitions_total[{RATE}]))",
                    "shard {{shard}}",
                )
            ],
            unit="short",
        ),
    ]


ROWS = (
    ("Fleet", fleet),
    ("Cycles", cycles),
    ("Power caps", caps),
    ("Health streams", streams),
    ("Device health", devices),
    ("Controller", controller),
)


def variables() -> list[Builder[model.VariableModel]]:
    return [
        dash.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        dash.QueryVariable("node")
        .label("Node")
        .datasource(DATASOURCE)
        .query("label_values(capwatch_info, node)")
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*"),
        dash.QueryVariable("gpu")
        .label("GPU")
        .datasource(DATASOURCE)
        .query("label_values(capwatch_gpu_applied_cap_watts, gpu)")
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.NUMERICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*"),
    ]


def build() -> model.Dashboard:
    """The dashboard, as the SDK's builders make it."""
    board = (
        dash.Dashboard(TITLE)
        .uid(UID)
        .description("GPU power caps on Kubernetes: is every node enforcing, and why not.")
        .tags(["capwatch", "gpu"])
        .editable()
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .variables(variables())
    )
    ids = iter(range(1, 1000))
    for title, panels in ROWS:
        board = board.with_row(dash.Row(title).id(next(ids)))
        for panel in panels():
            board = board.with_panel(panel.id(next(ids)))
    return board.build()


def expressions(board: Mapping[str, Any] | None = None) -> list[str]:
    """Every panel's PromQL in a dashboard's JSON (the committed one by default), in panel
    order; rows hold none, and collapsed rows' panels are read too."""
    if board is None:
        board = json.loads(COMMITTED.read_text())
    found = []
    for panel in board.get("panels", []):
        for inner in [panel, *panel.get("panels", [])]:
            found.extend(str(target["expr"]) for target in inner.get("targets", []))
    return found
