"""The controller's configuration: one frozen object, built and validated in one place.

Every flag has an environment twin (``CAPWATCH_CONTROLLER_<FLAG>``, and the
Downward API's ``POD_NAME``/``POD_NAMESPACE`` for the pod's own name and
namespace). Everything is checked before anything starts -- the targets file
is parsed, the shard index derived -- and a bad value raises
:class:`~capwatch.kit.errors.ConfigError` naming the flag, which the command line
prints as one line before exiting 2.
"""

from __future__ import annotations

import argparse
import re
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from capwatch.controller.discovery import parse_targets
from capwatch.controller.leasing import LeaseConfig
from capwatch.controller.sharding import ordinal
from capwatch.controller.taints import Effect, TaintPolicy, parse_effect
from capwatch.kit.addresses import host_port, listen_port
from capwatch.kit.errors import ConfigError
from capwatch.kit.flags import (
    LOG_FORMAT_OPTION,
    LogFormat,
    Option,
    add_options,
    boolean,
    is_digits,
    log_level_option,
    optional_path,
    positive_float,
    read_options,
    release_name,
)
from capwatch.kit.tls import ca_flag, pair_flags

DEFAULT_AGENT_SELECTOR = "app.kubernetes.io/name=capwatch,app.kubernetes.io/component=node-agent"
DEFAULT_GPU_NODE_SELECTOR = "nvidia.com/gpu.present=true"
DEFAULT_LISTEN = "0.0.0.0:50052"
DEFAULT_METRICS_PORT = 9401
DEFAULT_PROBE_PORT = 8082
MAX_SHARDS = 1024
_SELECTOR_TERM = re.compile(r"!?[A-Za-z0-9./_-]+((==|!=|=)[A-Za-z0-9._-]*)?")


@dataclass(frozen=True, kw_only=True)
class AgentTls:
    """How the controller dials agents over TLS (the chart's ``grpc.tls``)."""

    ca: Path
    cert: Path | None  # with key: mutual TLS
    key: Path | None
    server_name: str | None  # the name agents' certificates carry, when not their pod IP


@dataclass(frozen=True, kw_only=True)
class CleanupLimits:
    """``capwatch controller cleanup``'s deadlines: one request's, and the whole run's."""

    request_s: float
    overall_s: float


@dataclass(frozen=True, kw_only=True)
class ControllerSettings:
    namespace: str | None  # the release namespace (agents, Leases); None only with --dry-run
    targets: Mapping[str, str] | None  # --targets: static discovery; None: watch agent pods
    agent_selector: str
    agent_port: int
    gpu_node_selector: str
    release: str  # the Helm release: its Leases, Events' component, DeviceTaintRules
    shards: int
    shard_index: int
    identity: str
    lease: LeaseConfig
    condition_heartbeat_s: float
    dial_rate: float  # agent streams opened a second, at most
    taints: TaintPolicy  # the DeviceTaintRules of faulted GPUs
    cleanup: CleanupLimits  # ``controller cleanup`` only
    grpc_listen: str
    metrics_port: int | None  # None: no metrics endpoint
    probe_port: int | None  # None: no probe endpoint
    dry_run: bool
    kubeconfig: Path | None
    agent_tls: AgentTls | None
    log_level: str
    log_format: LogFormat

    @property
    def lease_name(self) -> str:
        # The release's, and the shard count's: the pods of two counts (a change of
        # --shards rolling out) never contend for one Lease (docs/upgrades.md).
        return f"{self.release}-controller-{self.shard_index}-of-{self.shards}"


def _selector(flag: str, text: str) -> str:
    terms = [t.strip() for t in text.split(",")] if text.strip() else []
    if not terms or not all(_SELECTOR_TERM.fullmatch(t) for t in terms):
        raise ConfigError(flag, f"not an equality-based label selector: {text!r}")
    return ",".join(terms)


def _count(flag: str, text: str) -> int:
    if not is_digits(text) or not 1 <= int(text) <= MAX_SHARDS:
        raise ConfigError(flag, f"must be an integer from 1 to {MAX_SHARDS}, got {text!r}")
    return int(text)


def _index(flag: str, text: str) -> int | None:
    if text == "":
        return None
    if not is_digits(text):
        raise ConfigError(flag, f"must be a non-negative integer, got {text!r}")
    return int(text)


def _optional_port(flag: str, text: str) -> int | None:
    return None if text == "0" else listen_port(flag, text)


def _listen(flag: str, text: str) -> str:
    if host_port(text) is None:
        raise ConfigError(flag, f"expected host:port, got {text!r}")
    return text


def _text(flag: str, text: str) -> str:
    return text


_OPTIONS = (
    Option(
        flag="--namespace",
        env="POD_NAMESPACE",
        default="",
        convert=_text,
        help="the release namespace: where the agent pods run and the Leases live",
    ),
    Option(
        flag="--targets",
        env="CAPWATCH_CONTROLLER_TARGETS",
        default="",
        convert=optional_path,
        help="follow the agents in this file (one 'NODE ADDRESS' per line, # comments) "
        "instead of watching the agent pods",
    ),
    Option(
        flag="--agent-selector",
        env="CAPWATCH_CONTROLLER_AGENT_SELECTOR",
        default=DEFAULT_AGENT_SELECTOR,
        convert=_selector,
        help="label selector of the agent pods (the chart's labels)",
    ),
    Option(
        flag="--agent-port",
        env="CAPWATCH_CONTROLLER_AGENT_PORT",
        default="50051",
        convert=listen_port,
        help="the agents' gRPC port",
    ),
    Option(
        flag="--gpu-node-selector",
        env="CAPWATCH_CONTROLLER_GPU_NODE_SELECTOR",
        default=DEFAULT_GPU_NODE_SELECTOR,
        convert=_selector,
        help="label selector of the nodes that should run an agent",
    ),
    Option(
        flag="--shards",
        env="CAPWATCH_CONTROLLER_SHARDS",
        default="1",
        convert=_count,
        help="how many shards split the nodes (jump hash of the node name)",
    ),
    Option(
        flag="--shard-index",
        env="CAPWATCH_CONTROLLER_SHARD_INDEX",
        default="",
        convert=_index,
        help="this replica's shard; default: its StatefulSet ordinal mod --shards",
    ),
    Option(
        flag="--pod-name",
        env="POD_NAME",
        default="",
        convert=_text,
        help="this pod's name (the StatefulSet ordinal, and the Lease identity)",
    ),
    Option(
        flag="--pod-uid",
        env="POD_UID",
        default="",
        convert=_text,
        help="this pod's UID (with --pod-name, the Lease identity the fencing policy checks)",
    ),
    Option(
        flag="--identity",
        env="CAPWATCH_CONTROLLER_IDENTITY",
        default="",
        convert=_text,
        help="the Lease holder identity; default: <pod name>_<pod uid> (what the chart's "
        "fencing policy compares with the token's pod), else the host name and a random suffix",
    ),
    Option(
        flag="--lease-duration",
        env="CAPWATCH_CONTROLLER_LEASE_DURATION",
        default="15",
        convert=positive_float,
        help="seconds a standby waits before taking over an unrenewed Lease",
    ),
    Option(
        flag="--renew-deadline",
        env="CAPWATCH_CONTROLLER_RENEW_DEADLINE",
        default="10",
        convert=positive_float,
        help="seconds the leader keeps trying to renew before it stops writing (at least 1, "
        "and more than 1.2 retry periods)",
    ),
    Option(
        flag="--retry-period",
        env="CAPWATCH_CONTROLLER_RETRY_PERIOD",
        default="2",
        convert=positive_float,
        help="seconds between attempts to acquire or renew the Lease (at least 0.1)",
    ),
    Option(
        flag="--condition-heartbeat",
        env="CAPWATCH_CONTROLLER_CONDITION_HEARTBEAT",
        default="300",
        convert=positive_float,
        help="seconds between rewrites of an unchanged condition (lastHeartbeatTime)",
    ),
    Option(
        flag="--dial-rate",
        env="CAPWATCH_CONTROLLER_DIAL_RATE",
        default="500",
        convert=positive_float,
        help="agent streams opened a second at most (a second's worth at once): a start "
        "subscribes N nodes in about N / rate seconds",
    ),
    Option(
        flag="--cleanup-timeout",
        env="CAPWATCH_CONTROLLER_CLEANUP_TIMEOUT",
        default="240",
        convert=positive_float,
        help="controller cleanup: seconds for the whole run, retries included; what is "
        "left then is named in the log",
    ),
    Option(
        flag="--cleanup-request-timeout",
        env="CAPWATCH_CONTROLLER_CLEANUP_REQUEST_TIMEOUT",
        default="10",
        convert=positive_float,
        help="controller cleanup: seconds for each request (a page of the node list, one "
        "node's patch) before it is tried again",
    ),
    Option(
        flag="--release",
        env="CAPWATCH_CONTROLLER_RELEASE",
        default="capwatch",
        convert=release_name,
        help="the Helm release: names the Leases, Events' component and DeviceTaintRules "
        "the controller writes, so two releases never touch each other's",
    ),
    Option(
        flag="--device-taints",
        env="CAPWATCH_CONTROLLER_DEVICE_TAINTS",
        default="true",
        convert=boolean,
        help="keep a DeviceTaintRule on each faulted GPU a ResourceSlice names",
    ),
    Option(
        flag="--device-taint-effect",
        env="CAPWATCH_CONTROLLER_DEVICE_TAINT_EFFECT",
        default="",
        convert=parse_effect,
        repeatable=True,
        help="CATEGORY=EFFECT: the taint's effect for a fault category (xid, gpu_lost, "
        "ecc_uncorrected, row_remap_failure): None (visible only, the default), "
        "NoSchedule or NoExecute; repeatable",
    ),
    Option(
        flag="--device-taint-hold-down",
        env="CAPWATCH_CONTROLLER_DEVICE_TAINT_HOLD_DOWN",
        default="300",
        convert=positive_float,
        help="seconds a recovered GPU stays tainted, so a flapping one does not churn rules",
    ),
    Option(
        flag="--grpc-listen",
        env="CAPWATCH_CONTROLLER_GRPC_LISTEN",
        default=DEFAULT_LISTEN,
        convert=_listen,
        help="where the cluster stream (capwatch.v1.ClusterHealthService) is served",
    ),
    Option(
        flag="--metrics-port",
        env="CAPWATCH_CONTROLLER_METRICS_PORT",
        default=str(DEFAULT_METRICS_PORT),
        convert=_optional_port,
        help="Prometheus metrics port (0 disables)",
    ),
    Option(
        flag="--probe-port",
        env="CAPWATCH_CONTROLLER_PROBE_PORT",
        default=str(DEFAULT_PROBE_PORT),
        convert=_optional_port,
        help="GET /readyz and /healthz port (0 disables)",
    ),
    Option(
        flag="--dry-run",
        env="CAPWATCH_CONTROLLER_DRY_RUN",
        default="false",
        convert=boolean,
        help="no API server: print the condition patches and Events instead of writing them "
        "(needs --targets)",
        switch=True,
    ),
    Option(
        flag="--kubeconfig",
        env="KUBECONFIG",
        default="",
        convert=optional_path,
        help="kubeconfig for running outside a cluster (in-cluster config otherwise)",
    ),
    Option(
        flag="--agent-tls-ca",
        env="CAPWATCH_CONTROLLER_AGENT_TLS_CA",
        default="",
        convert=optional_path,
        help="dial agents over TLS, trusting this CA (PEM)",
    ),
    Option(
        flag="--agent-tls-cert",
        env="CAPWATCH_CONTROLLER_AGENT_TLS_CERT",
        default="",
        convert=optional_path,
        help="client certificate for agents that require mutual TLS (PEM)",
    ),
    Option(
        flag="--agent-tls-key",
        env="CAPWATCH_CONTROLLER_AGENT_TLS_KEY",
        default="",
        convert=optional_path,
        help="private key for --agent-tls-cert (PEM)",
    ),
    Option(
        flag="--agent-tls-server-name",
        env="CAPWATCH_CONTROLLER_AGENT_TLS_SERVER_NAME",
        default="",
        convert=_text,
        help="the name the agents' certificates carry (they are dialled by pod IP)",
    ),
    log_level_option("info"),
    LOG_FORMAT_OPTION,
)


def add_controller_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser, _OPTIONS)


def controller_settings(
    namespace: argparse.Namespace, environ: Mapping[str, str]
) -> ControllerSettings:
    values = read_options(namespace, environ, _OPTIONS)
    shards: int = values["shards"]
    pod_name: str = values["pod_name"]
    index: int | None = values["shard_index"]
    if index is None:
        index = ordinal(pod_name) % shards if pod_name else 0
        if not pod_name and shards > 1:
            raise ConfigError("--shard-index", "required with --shards > 1 outside a StatefulSet")
    if index >= shards:
        raise ConfigError("--shard-index", f"must be below --shards ({shards}), got {index}")
    lease = LeaseConfig(
        lease_s=values["lease_duration"],
        renew_deadline_s=values["renew_deadline"],
        retry_s=values["retry_period"],
    )
    targets_file: Path | None = values["targets"]
    dry_run: bool = values["dry_run"]
    release_namespace: str = values["namespace"]
    if dry_run and targets_file is None:
        raise ConfigError("--dry-run", "needs --targets (there is no API server to discover from)")
    if not dry_run and not release_namespace:
        raise ConfigError("--namespace", "required (set POD_NAMESPACE) unless --dry-run")
    effects: dict[str, Effect] = {}
    for category, effect in values["device_taint_effect"]:
        if category in effects and effects[category] is not effect:
            raise ConfigError(
                "--device-taint-effect", f"{category} is given two effects: choose one"
            )
        effects[category] = effect
    cleanup = CleanupLimits(
        request_s=values["cleanup_request_timeout"], overall_s=values["cleanup_timeout"]
    )
    if cleanup.request_s > cleanup.overall_s:
        raise ConfigError(
            "--cleanup-request-timeout",
            f"{cleanup.request_s:g}s is longer than --cleanup-timeout ({cleanup.overall_s:g}s)",
        )
    taints = TaintPolicy(
        release=values["release"],
        enabled=values["device_taints"],
        effects=effects,
        hold_down_s=values["device_taint_hold_down"],
    )
    return ControllerSettings(
        namespace=release_namespace or None,
        targets=None if targets_file is None else parse_targets(targets_file),
        agent_selector=values["agent_selector"],
        agent_port=values["agent_port"],
        gpu_node_selector=values["gpu_node_selector"],
        release=values["release"],
        shards=shards,
        shard_index=index,
        identity=values["identity"] or _identity(pod_name, values["pod_uid"]),
        lease=lease,
        condition_heartbeat_s=values["condition_heartbeat"],
        dial_rate=values["dial_rate"],
        taints=taints,
        cleanup=cleanup,
        grpc_listen=values["grpc_listen"],
        metrics_port=values["metrics_port"],
        probe_port=values["probe_port"],
        dry_run=dry_run,
        kubeconfig=values["kubeconfig"],
        agent_tls=_agent_tls(values),
        log_level=values["log_level"],
        log_format=values["log_format"],
    )


def _agent_tls(values: Mapping[str, object]) -> AgentTls | None:
    ca, cert, key = values["agent_tls_ca"], values["agent_tls_cert"], values["agent_tls_key"]
    name = values["agent_tls_server_name"]
    if ca is None:
        if cert is not None or key is not None or name:
            raise ConfigError("--agent-tls-ca", "required by the other --agent-tls-* flags")
        return None
    if (cert is None) != (key is None):
        raise ConfigError("--agent-tls-cert", "--agent-tls-cert and --agent-tls-key go together")
    assert isinstance(ca, Path)
    # Loaded as grpc will load them, now: a directory or a file that is not PEM would
    # otherwise be a traceback at start, or every agent unreachable at its handshake.
    ca_flag("--agent-tls-ca", ca)
    if isinstance(cert, Path) and isinstance(key, Path):
        pair_flags("--agent-tls-cert", cert, "--agent-tls-key", key)
    return AgentTls(
        ca=ca,
        cert=cert if isinstance(cert, Path) else None,
        key=key if isinstance(key, Path) else None,
        server_name=str(name) or None,
    )


def _identity(pod_name: str, pod_uid: str) -> str:
    """``<pod name>_<pod uid>``: one per pod incarnation, and what a pod-bound token
    tells the API server (its fencing policy compares the two). Outside a pod, the host
    name and a random suffix."""
    if pod_name and pod_uid:
        return f"{pod_name}_{pod_uid}"
    return f"{pod_name or socket.gethostname()}_{uuid.uuid4().hex[:8]}"
