"""The rules' expressions in a real Prometheus (Debian's package) scraping real processes.

Two sim agents, a controller in --dry-run following them, and a target where
nothing listens, all scraped every second by a Prometheus that loads the rules
file. Agent a's GPU 0 refuses its cap writes for a range of cycles, then
recovers; agent b serves TLS on its gRPC port (so its certificate-reload series
exist), which the controller dials in plaintext (so b's condition is Unknown).

Every alert's expression is queried through the HTTP API, without its final
comparison, and must return series at some point of the run. The write-failure
alert's expression and the node-condition ones, comparison kept, must be true
while GPU 0 fails and false after it recovers. Ranges are evaluated 30 times
shorter (the rules assume a 30 s scrape, this Prometheus scrapes every 1 s);
promtool's unit tests hold the rules to their real durations.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.alerts.rules import RULES, alerts, scaled, watched
from tests.metrics.prometheus import prometheus_binary, query
from tests.metrics.support import (
    CAPWATCH,
    free_port,
    http_get,
    running,
    running_agent,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

SCALE = 30  # the rules' 30 s scrape over this Prometheus's 1 s
NODE_A = "alert-node-a"
TRAINER = ("ml", "trainer-0")
FAILING = range(20, 81)  # agent a's cycles in which GPU 0's writes fail (4 per second)
DEVICE_ALERTS = frozenset({"CapwatchGpuLost", "CapwatchGpuFault"})
# The expressions that are true while GPU 0 fails and false after, comparison kept.
WHILE_FAILING = ("CapwatchCapWritesFailing", "CapwatchNodeConditionFalse")
TIMEOUT_S = 60.0

GPU = "{min_watts: 200, max_watts: 700, default_watts: 700}"
SCENARIO = f"""\
description: Two GPUs; GPU 0's cap writes fail in cycles {FAILING.start}-{FAILING.stop - 1}.
node_name: {NODE_A}
safe_default_watts: 300
gpus:
  - {{uuid: GPU-a1e70000-0000-4000-8000-000000000000, {GPU[1:-1]}}}
  - {{uuid: GPU-a1e70000-0000-4000-8000-000000000001, {GPU[1:-1]}}}
pods:
  - namespace: {TRAINER[0]}
    name: {TRAINER[1]}
    uid: a1e70000-0000-4000-8000-00000000000a
    annotations: {{capwatch.io/gpu-power-limit: "450"}}
  - namespace: inference
    name: server-a
    uid: a1e70000-0000-4000-8000-00000000000b
    annotations: {{capwatch.io/gpu-power-limit: "350"}}
processes:
  - {{gpu: 0, pid: 5101, pod: a1e70000-0000-4000-8000-00000000000a}}
  - {{gpu: 1, pid: 5201, pod: a1e70000-0000-4000-8000-00000000000b}}
faults:
  - op: set_limit
    gpu: 0
    error: no_permission
    cycles: {{from: {FAILING.start}, to: {FAILING.stop - 1}}}
"""


@dataclass
class Run:
    """What the run saw: alerts whose watched series appeared, and when each expression of
    WHILE_FAILING was true, relative to the failure."""

    returned: set[str] = field(default_factory=set)
    true_while_failing: set[str] = field(default_factory=set)
    false_after_recovery: set[str] = field(default_factory=set)
    owners: set[tuple[str, str]] = field(default_factory=set)
    rules_loaded: int = 0
    notes: list[str] = field(default_factory=list)


def _certificate(directory: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is needed to make the test certificate")
    cert, key = directory / "tls.crt", directory / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return cert, key


def _config(tmp_path: Path, agents: list[str], controller: str) -> Path:
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n"
        "  scrape_interval: 1s\n"
        "  scrape_timeout: 1s\n"
        "  evaluation_interval: 1s\n"
        f"rule_files: ['{RULES}']\n"
        "scrape_configs:\n"
        "  - job_name: capwatch\n"
        "    static_configs:\n"
        f"      - targets: [{', '.join(repr(a) for a in agents)}]\n"
        "  - job_name: capwatch-controller\n"
        "    static_configs:\n"
        f"      - targets: ['{controller}']\n"
    )
    return config


def _returns(api: str, promql: str) -> bool:
    try:
        return bool(query(api, promql))
    except OSError:  # not listening yet
        return False


def _observe(api: str, run: Run, expressions: dict[str, str], *, failing: bool) -> None:
    """One round of queries: every watched expression, and the WHILE_FAILING ones."""
    for name, expr in expressions.items():
        if name not in run.returned and _returns(api, watched(expr)):
            run.returned.add(name)
    for name in WHILE_FAILING:
        true = _returns(api, scaled(expressions[name], SCALE))
        if failing and true:
            run.true_while_failing.add(name)
        if not failing and not true and name in run.true_while_failing:
            run.false_after_recovery.add(name)


def _failing_now(api: str) -> bool | None:
    """Whether agent a's last scraped cycles failed (None: nothing scraped yet)."""
    try:
        ready = query(
            api, f'capwatch_ready * on(instance) group_left() capwatch_info{{node="{NODE_A}"}}'
        )
    except OSError:
        return None
    if not ready:
        return None
    return ready[0]["value"][1] == "0"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The whole run, once for the module's tests (about 40 s)."""
    binary = prometheus_binary()
    tmp = tmp_path_factory.mktemp("live-alerts")
    (tmp / "a").mkdir()
    (tmp / "b").mkdir()
    scenario = tmp / "a" / "scenario.yaml"
    scenario.write_text(SCENARIO)
    cert, key = _certificate(tmp / "b")
    port_a, port_b, port_c, dead, web = (free_port() for _ in range(5))
    expressions = {rule["alert"]: rule["expr"] for rule in alerts()}
    result = Run()
    with ExitStack() as stack:
        metrics = ["--metrics-address", "127.0.0.1", "--metrics-port"]
        agent_a = stack.enter_context(
            running_agent(
                tmp / "a",
                ["--scenario", str(scenario), "--interval", "0.25", *metrics, str(port_a)],
            )
        )
        agent_b = stack.enter_context(
            running_agent(
                tmp / "b",
                [
                    *("--interval", "1", "--grpc-tls-cert", str(cert), "--grpc-tls-key", str(key)),
                    *(*metrics, str(port_b)),
                ],
            )
        )
        targets = tmp / "targets"
        targets.write_text(f"{NODE_A} {agent_a.grpc_target}\nsim-node-0 {agent_b.grpc_target}\n")
        controller = stack.enter_context(
            running(
                [
                    *(*CAPWATCH, "controller", "--dry-run", "--targets", str(targets)),
                    *("--grpc-listen", "127.0.0.1:0", "--probe-port", "0"),
                    *("--metrics-port", str(port_c), "--log-level", "info"),
                ]
            )
        )
        controller.wait_for(rf"metrics serving address=\S+:{port_c} ")
        config = _config(
            tmp,
            [f"127.0.0.1:{p}" for p in (port_a, port_b, dead)],
            f"127.0.0.1:{port_c}",
        )
        prometheus = stack.enter_context(
            running(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{web}",
                    "--log.level=warn",
                ]
            )
        )
        api = f"http://127.0.0.1:{web}"
        deadline = time.monotonic() + TIMEOUT_S
        seen_failure = recovered = False
        while time.monotonic() < deadline:
            assert prometheus.proc.poll() is None, prometheus.log
            failing = _failing_now(api)
            if failing is None:
                time.sleep(0.25)
                continue
            seen_failure |= failing
            recovered = recovered or (seen_failure and not failing)
            _observe(api, result, expressions, failing=bool(failing))
            for series in query(api, "capwatch_gpu_applied_cap_watts"):
                labels = series["metric"]  # Prometheus drops empty labels
                result.owners.add((labels.get("namespace", ""), labels.get("pod", "")))
            done = set(WHILE_FAILING) <= result.false_after_recovery
            if recovered and done and set(expressions) - DEVICE_ALERTS <= result.returned:
                break
            time.sleep(0.25)
        groups = query_rules(api)
        result.rules_loaded = sum(len(g["rules"]) for g in groups)
        result.notes.append(f"failure seen: {seen_failure}, recovered: {recovered}")
        result.notes.append(agent_a.log[-2000:])
    return result


def query_rules(api: str) -> list[dict[str, Any]]:
    """The rule groups the server has loaded."""
    body = json.loads(http_get(f"{api}/api/v1/rules"))
    assert body["status"] == "success", body
    groups: list[dict[str, Any]] = body["data"]["groups"]
    return groups


def test_prometheus_loads_every_rule(run: Run):
    """The server itself loads the rules file: as many rules as the file has."""
    assert run.rules_loaded == len(alerts()), run.notes


def test_every_agent_and_controller_expression_returns_series(run: Run):
    """Each alert's expression without its comparison returns series from the real
    agents and controller (the device alerts are the next test's)."""
    expected = {rule["alert"] for rule in alerts()} - DEVICE_ALERTS
    assert expected - run.returned == set(), run.notes


def test_device_alert_expressions_return_series(run: Run):
    """The device alerts' expressions (on the agent's device-health metrics) return series."""
    assert DEVICE_ALERTS - run.returned == set(), run.notes


def test_write_failure_and_condition_false_follow_the_failing_gpu(run: Run):
    """The cap-write alert's expression and the node-condition False one are true while GPU
    0's writes fail, and false once it has recovered."""
    assert run.true_while_failing >= set(WHILE_FAILING), run.notes
    assert run.false_after_recovery >= set(WHILE_FAILING), run.notes


def test_cap_series_name_their_owner_pod(run: Run):
    """Through Prometheus, GPU 0's cap series carries the scenario's owner pod."""
    assert TRAINER in run.owners, run.owners
