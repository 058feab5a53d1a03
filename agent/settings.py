"""The agent's configuration: one frozen object, built and validated in one place.

Every flag has an environment-variable twin (``NODE_NAME`` for
``--node-name``, ``CAPWATCH_<FLAG>`` for the rest); a flag on the command line
wins over its twin. Everything is validated before anything starts, and a bad
value raises :class:`ConfigError` naming the flag and the reason, which the
command line prints as one line before exiting 2.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from capwatch.agent.capping import DEFAULT_ANNOTATION_KEY, Mode, UnclaimedPolicy
from capwatch.agent.dra.slices import DEFAULT_UUID_ATTRIBUTE
from capwatch.agent.gpus import MAX_REQUEST_WATTS
from capwatch.agent.health.faults import (
    DEFAULT_FAULT_RECOVERY_S,
    DEFAULT_XID_IGNORE,
    XidPolicy,
    parse_xids,
)
from capwatch.kit.errors import ConfigError
from capwatch.kit.flags import (
    LOG_FORMAT_OPTION,
    LogFormat,
    Option,
    absolute_path,
    add_options,
    boolean,
    enum_choice,
    log_level_option,
    optional_path,
    path,
    positive_float,
    read_options,
    release_name,
    writable_directory,
)
from capwatch.kit.names import is_dns_label, is_dns_subdomain, node_name

DEFAULT_INTERVAL_S = 15.0
# How long the pod watch may deliver nothing before the view counts as not
# synced (kube/informer.py): much shorter than the ~105 s it took before a
# silent watch was noticed, and a watch request per node every 15-20 s.
DEFAULT_POD_SILENCE_BOUND_S = 30.0
MIN_POD_SILENCE_BOUND_S = 5.0
DEFAULT_SAFE_DEFAULT_WATTS = 300
DEFAULT_STATE_DIR = Path("/var/lib/capwatch")
DEFAULT_PROC_ROOT = Path("/proc")
MAX_INTERVAL_S = 3600.0
MIN_FAULT_RECOVERY_S = 1.0
MAX_FAULT_RECOVERY_S = 7 * 86400.0

# Kubernetes qualified names (the name part of annotation keys).
_QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


class BackendKind(str, Enum):
    NVML = "nvml"
    SIM = "sim"


@dataclass(frozen=True, kw_only=True)
class AgentSettings:
    node_name: str | None  # None only with the sim backend: the scenario names the node
    gpu_backend: BackendKind
    release: str  # the Helm release: its Events' component
    mode: Mode  # observe: the whole loop, no NVML write
    unclaimed_policy: UnclaimedPolicy  # a busy GPU nobody asks a cap for
    # The agent's own pod (the downward API's POD_NAMESPACE and POD_NAME): whether the
    # DaemonSet still runs here at shutdown decides the restore. None: not in a pod.
    agent_pod_namespace: str | None
    agent_pod_name: str | None
    scenario: Path | None  # sim only; None = the built-in scenario
    sim_limits_file: Path | None  # sim only; None = the simulated limits die with the process
    interval_s: float
    safe_default_watts: int
    cap_floor_watts: int | None  # the cluster's floor for every cap; None: none
    cap_ceiling_watts: int | None  # the cluster's ceiling for every cap; None: none
    annotation_key: str
    state_dir: Path
    proc_root: Path
    kubeconfig: Path | None
    pod_namespace: str | None  # None: pods in every namespace
    pod_events: bool  # Events on owner pods (Kubernetes pod view only)
    dra_claims: bool  # caps from DRA ResourceClaims (Kubernetes pod view only)
    dra_uuid_attribute: str  # the ResourceSlice device attribute holding the GPU UUID
    dra_sim_driver: bool  # sim only: serve as the DRA driver sim.capwatch.io
    kubelet_dir: Path  # the kubelet's --root-dir: the sim driver's sockets go under it
    pod_silence_bound_s: float  # a silent pod watch is not trusted for longer
    shutdown_grace_s: float
    xid_policy: XidPolicy  # which XIDs are device faults
    fault_recovery_s: float  # quiet window after which an XID or ECC fault clears
    log_level: str
    log_format: LogFormat

    @property
    def stale_after_s(self) -> float:
        return 3 * self.interval_s


def _interval(flag: str, text: str) -> float:
    value = positive_float(flag, text)
    if value > MAX_INTERVAL_S:
        raise ConfigError(flag, f"must be at most {MAX_INTERVAL_S:g} seconds, got {text!r}")
    return value


def _silence_bound(flag: str, text: str) -> float:
    value = positive_float(flag, text)
    if not MIN_POD_SILENCE_BOUND_S <= value <= MAX_INTERVAL_S:
        raise ConfigError(
            flag,
            f"must be between {MIN_POD_SILENCE_BOUND_S:g} and {MAX_INTERVAL_S:g} seconds,"
            f" got {text!r}",
        )
    return value


def _watts(flag: str, text: str) -> int:
    if not re.fullmatch(r"[0-9]+", text.strip()):
        raise ConfigError(flag, f"must be a positive integer number of watts, got {text!r}")
    value = int(text)
    if not 0 < value <= MAX_REQUEST_WATTS:
        raise ConfigError(flag, f"must be between 1 and {MAX_REQUEST_WATTS} watts, got {text!r}")
    return value


def _optional_watts(flag: str, text: str) -> int | None:
    return None if not text.strip() else _watts(flag, text)


def _xid_ignore(flag: str, text: str) -> tuple[frozenset[int], bool]:
    return parse_xids(text, option=flag, allow_all=True)


def _xid_fatal(flag: str, text: str) -> frozenset[int]:
    return parse_xids(text, option=flag, allow_all=False)[0]


def _fault_recovery(flag: str, text: str) -> float:
    value = positive_float(flag, text)
    if not MIN_FAULT_RECOVERY_S <= value <= MAX_FAULT_RECOVERY_S:
        raise ConfigError(
            flag,
            f"must be between {MIN_FAULT_RECOVERY_S:g} and {MAX_FAULT_RECOVERY_S:g} seconds,"
            f" got {text!r}",
        )
    return value


def _node_name(flag: str, text: str) -> str | None:
    return node_name(flag, text) if text else None


def _namespace(flag: str, text: str) -> str | None:
    if text and not is_dns_label(text):
        raise ConfigError(flag, f"not a valid namespace name: {text!r}")
    return text or None


def _pod_name(flag: str, text: str) -> str | None:
    if not text:
        return None
    if not is_dns_subdomain(text):
        raise ConfigError(flag, f"not a valid pod name: {text!r}")
    return text


def _attribute_name(flag: str, text: str) -> str:
    """A device attribute's name: a C identifier, optionally qualified by a domain."""
    domain, _, name = text.rpartition("/")
    if (domain and not is_dns_subdomain(domain)) or not re.fullmatch(
        r"[A-Za-z_][A-Za-z0-9_]{0,31}", name
    ):
        raise ConfigError(flag, f"not a ResourceSlice attribute name: {text!r}")
    return text


def _annotation_key(flag: str, text: str) -> str:
    prefix, _, name = text.rpartition("/")
    if "/" in text and not is_dns_subdomain(prefix):
        raise ConfigError(flag, f"prefix of {text!r} is not a DNS subdomain")
    if not name or len(name) > 63 or not _QUALIFIED_NAME.fullmatch(name):
        raise ConfigError(flag, f"not a valid annotation key: {text!r}")
    return text


# Shared with `capwatch forget`, which writes into the agent's state directory.
STATE_DIR_OPTION = Option(
    flag="--state-dir",
    env="CAPWATCH_STATE_DIR",
    default=str(DEFAULT_STATE_DIR),
    convert=path,
    help="directory for the ownership record (a hostPath in the DaemonSet)",
)

_OPTIONS = (
    Option(
        flag="--node-name",
        env="NODE_NAME",
        default="",
        convert=_node_name,
        help="this node's name (the pod view's spec.nodeName); defaults to the scenario's with sim",
    ),
    Option(
        flag="--gpu-backend",
        env="CAPWATCH_GPU_BACKEND",
        default="nvml",
        convert=enum_choice(BackendKind),
        help="nvml (real GPUs) or sim (scenario-driven simulator)",
    ),
    Option(
        flag="--mode",
        env="CAPWATCH_MODE",
        default=Mode.ENFORCE.value,
        convert=enum_choice(Mode),
        help="enforce (write caps) or observe (the whole loop, streams, metrics and Events, "
        "with no NVML write: each GPU's result says the limit it would have set)",
    ),
    Option(
        flag="--release",
        env="CAPWATCH_RELEASE",
        default="capwatch",
        convert=release_name,
        help="the Helm release: the pods' Events come from component RELEASE-agent",
    ),
    Option(
        flag="--unclaimed-policy",
        env="CAPWATCH_UNCLAIMED_POLICY",
        default=UnclaimedPolicy.SAFE_DEFAULT.value,
        convert=enum_choice(UnclaimedPolicy),
        help="a busy GPU no claim and no pod annotation asks a cap for: safeDefault caps it "
        "at --safe-default-watts, leave keeps its current limit (reason unclaimed)",
    ),
    Option(
        flag="--agent-pod-name",
        env="POD_NAME",
        default="",
        convert=_pod_name,
        help="this agent's own pod (the downward API's metadata.name): at shutdown the agent "
        "restores default limits only if its DaemonSet no longer runs on the node; unset, "
        "it always restores (docs/upgrades.md)",
    ),
    Option(
        flag="--agent-pod-namespace",
        env="POD_NAMESPACE",
        default="",
        convert=_namespace,
        help="this agent's own pod's namespace (the downward API's metadata.namespace)",
    ),
    Option(
        flag="--scenario",
        env="CAPWATCH_SCENARIO",
        default="",
        convert=optional_path,
        help="scenario file for the sim backend (default: the built-in scenario)",
    ),
    Option(
        flag="--sim-limits-file",
        env="CAPWATCH_SIM_LIMITS_FILE",
        default="",
        convert=optional_path,
        help="sim backend: keep the simulated power limits in this file, so that they "
        "outlive the agent as a real GPU's do (crash trials)",
    ),
    Option(
        flag="--interval",
        env="CAPWATCH_INTERVAL",
        default=str(DEFAULT_INTERVAL_S),
        convert=_interval,
        help="seconds to sleep after each cycle (fractions allowed)",
    ),
    Option(
        flag="--safe-default-watts",
        env="CAPWATCH_SAFE_DEFAULT_WATTS",
        default=str(DEFAULT_SAFE_DEFAULT_WATTS),
        convert=_watts,
        help="cap for GPUs whose pods ask for no single valid value",
    ),
    Option(
        flag="--cap-ceiling-watts",
        env="CAPWATCH_CAP_CEILING_WATTS",
        default="",
        convert=_optional_watts,
        help="the cluster's ceiling: no cap from any source (annotation, claim, safe "
        "default) is written above it; a request above it is clamped and reported "
        "('' for none)",
    ),
    Option(
        flag="--cap-floor-watts",
        env="CAPWATCH_CAP_FLOOR_WATTS",
        default="",
        convert=_optional_watts,
        help="the cluster's floor: no cap from any source is written below it ('' for none)",
    ),
    Option(
        flag="--annotation-key",
        env="CAPWATCH_ANNOTATION_KEY",
        default=DEFAULT_ANNOTATION_KEY,
        convert=_annotation_key,
        help="pod annotation holding the requested cap in integer watts",
    ),
    STATE_DIR_OPTION,
    Option(
        flag="--proc-root",
        env="CAPWATCH_PROC_ROOT",
        default=str(DEFAULT_PROC_ROOT),
        convert=path,
        help="the host's /proc (the agent runs with hostPID)",
    ),
    Option(
        flag="--kubeconfig",
        env="KUBECONFIG",
        default="",
        convert=optional_path,
        help="kubeconfig for running outside a cluster (in-cluster config otherwise)",
    ),
    Option(
        flag="--pod-namespace",
        env="CAPWATCH_POD_NAMESPACE",
        default="",
        convert=_namespace,
        help="watch pods in this namespace only (a namespaced Role); default: every namespace",
    ),
    Option(
        flag="--pod-events",
        env="CAPWATCH_POD_EVENTS",
        default="true",
        convert=boolean,
        help="post Kubernetes Events on the pods whose GPUs are capped, when what they "
        "would say changes (Kubernetes pod view only; needs create on events)",
    ),
    Option(
        flag="--dra-claims",
        env="CAPWATCH_DRA_CLAIMS",
        default="true",
        convert=boolean,
        help="take caps from DRA ResourceClaims allocated on this node (a capwatch.io "
        "PowerCap config; docs/claims.md): get of the claims this node's pods name, "
        "list+watch of this node's resourceslices (the sim backend: the scenario's claims)",
    ),
    Option(
        flag="--dra-uuid-attribute",
        env="CAPWATCH_DRA_UUID_ATTRIBUTE",
        default=DEFAULT_UUID_ATTRIBUTE,
        convert=_attribute_name,
        help="the ResourceSlice device attribute that holds a GPU's UUID (the NVIDIA DRA "
        "driver's: uuid)",
    ),
    Option(
        flag="--dra-sim-driver",
        env="CAPWATCH_DRA_SIM_DRIVER",
        default="false",
        convert=boolean,
        help="sim backend only: be the DRA driver sim.capwatch.io for the simulated GPUs "
        "(publish their ResourceSlice, register with the kubelet, prepare claims, serve it "
        "the health mirror; docs/dra-health.md)",
    ),
    Option(
        flag="--kubelet-dir",
        env="CAPWATCH_KUBELET_DIR",
        default="/var/lib/kubelet",
        convert=absolute_path,
        help="the kubelet's root directory: --dra-sim-driver's sockets go in its "
        "plugins_registry and plugins directories",
    ),
    Option(
        flag="--pod-silence-bound",
        env="CAPWATCH_POD_SILENCE_BOUND",
        default=f"{DEFAULT_POD_SILENCE_BOUND_S:g}",
        convert=_silence_bound,
        help="seconds the pod watch may deliver nothing (no event, no bookmark, no clean "
        "end) before the pod view counts as not synced and cycles abort; watches are "
        "renewed every 1/2 to 2/3 of it (Kubernetes pod view only)",
    ),
    Option(
        flag="--shutdown-grace",
        env="CAPWATCH_SHUTDOWN_GRACE",
        default="20",
        convert=positive_float,
        help="seconds to wait for an in-flight cycle at shutdown before restoring caps anyway",
    ),
    Option(
        flag="--xid-ignore",
        env="CAPWATCH_XID_IGNORE",
        default=",".join(str(code) for code in sorted(DEFAULT_XID_IGNORE)),
        convert=_xid_ignore,
        help="XIDs that are not device faults (application errors), comma-separated; "
        "'all' ignores every XID but --xid-fatal's; '' ignores none",
    ),
    Option(
        flag="--xid-fatal",
        env="CAPWATCH_XID_FATAL",
        default="",
        convert=_xid_fatal,
        help="XIDs that are device faults whatever --xid-ignore says, comma-separated",
    ),
    Option(
        flag="--fault-recovery",
        env="CAPWATCH_FAULT_RECOVERY",
        default=f"{DEFAULT_FAULT_RECOVERY_S:g}",
        convert=_fault_recovery,
        help="seconds without a new XID or ECC error after which that fault clears "
        "(lost GPUs and row-remap failures clear when the device says so)",
    ),
    log_level_option("info"),
    LOG_FORMAT_OPTION,
)


def add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the agent's flags. Values stay raw strings until :func:`agent_settings`."""
    add_options(parser, _OPTIONS)


def agent_settings(namespace: argparse.Namespace, environ: Mapping[str, str]) -> AgentSettings:
    """Build and validate the settings from parsed flags and the environment."""
    values = read_options(namespace, environ, _OPTIONS)
    settings = AgentSettings(
        node_name=values["node_name"],
        gpu_backend=values["gpu_backend"],
        release=values["release"],
        mode=values["mode"],
        unclaimed_policy=values["unclaimed_policy"],
        agent_pod_namespace=values["agent_pod_namespace"],
        agent_pod_name=values["agent_pod_name"],
        scenario=values["scenario"],
        sim_limits_file=values["sim_limits_file"],
        interval_s=values["interval"],
        safe_default_watts=values["safe_default_watts"],
        cap_floor_watts=values["cap_floor_watts"],
        cap_ceiling_watts=values["cap_ceiling_watts"],
        annotation_key=values["annotation_key"],
        state_dir=values["state_dir"],
        proc_root=values["proc_root"],
        kubeconfig=values["kubeconfig"],
        pod_namespace=values["pod_namespace"],
        pod_events=values["pod_events"],
        dra_claims=values["dra_claims"],
        dra_uuid_attribute=values["dra_uuid_attribute"],
        dra_sim_driver=values["dra_sim_driver"],
        kubelet_dir=values["kubelet_dir"],
        pod_silence_bound_s=values["pod_silence_bound"],
        shutdown_grace_s=values["shutdown_grace"],
        xid_policy=XidPolicy(
            ignore=values["xid_ignore"][0],
            ignore_all=values["xid_ignore"][1],
            fatal=values["xid_fatal"],
        ),
        fault_recovery_s=values["fault_recovery"],
        log_level=values["log_level"],
        log_format=values["log_format"],
    )
    _check_combination(settings)
    return settings


def _check_combination(settings: AgentSettings) -> None:
    floor, ceiling = settings.cap_floor_watts, settings.cap_ceiling_watts
    if floor is not None and ceiling is not None and floor > ceiling:
        raise ConfigError(
            "--cap-floor-watts", f"{floor} W is above --cap-ceiling-watts {ceiling} W"
        )
    if (settings.agent_pod_name is None) != (settings.agent_pod_namespace is None):
        given = "--agent-pod-name" if settings.agent_pod_name else "--agent-pod-namespace"
        other = "--agent-pod-namespace" if settings.agent_pod_name else "--agent-pod-name"
        raise ConfigError(given, f"needs {other} too (the downward API gives both)")
    if settings.gpu_backend is BackendKind.NVML:
        # A simulator's flag first: it says which backend was meant (nvml is the default).
        if settings.dra_sim_driver:
            raise ConfigError(
                "--dra-sim-driver",
                "only meaningful with --gpu-backend sim: real GPUs are prepared by their "
                "own DRA driver, which can read capwatch's health (docs/dra-health.md)",
            )
        if settings.scenario is not None:
            raise ConfigError("--scenario", "only meaningful with --gpu-backend sim")
        if settings.sim_limits_file is not None:
            raise ConfigError("--sim-limits-file", "only meaningful with --gpu-backend sim")
        if settings.node_name is None:
            raise ConfigError("--node-name", "required with the nvml backend (set NODE_NAME)")
        if not settings.proc_root.is_dir():
            raise ConfigError("--proc-root", f"{settings.proc_root} is not a directory")
    if settings.dra_sim_driver and not settings.kubelet_dir.is_dir():
        raise ConfigError(
            "--kubelet-dir",
            f"{settings.kubelet_dir} is not a directory (the sim driver registers there)",
        )
    if settings.scenario is not None and not settings.scenario.is_file():
        raise ConfigError("--scenario", f"{settings.scenario} is not a readable file")
    writable_directory("--state-dir", settings.state_dir)
