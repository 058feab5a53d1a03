"""``capwatch watch``'s settings: its flags, their environment twins, and the client they make.

Every flag is validated here, before anything connects, and a mistake is one
line naming the flag (exit 2). The connection options (target, TLS) are
the client library's (:mod:`capwatch.client.connection`), shared with ``capwatch shim``.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from dataclasses import dataclass

from capwatch.api.limits import MAX_HEARTBEAT_S, MIN_HEARTBEAT_S
from capwatch.client.cluster_health import ClusterHealthClient
from capwatch.client.connection import CONNECTION_OPTIONS, DEFAULT_TARGET, Connection, connection
from capwatch.client.node_health import DraVersion, NodeHealthClient
from capwatch.kit.errors import ConfigError
from capwatch.kit.flags import (
    LOG_FORMAT_OPTION,
    LogFormat,
    Option,
    add_options,
    enum_choice,
    is_digits,
    log_level_option,
    read_options,
)
from capwatch.kit.names import node_name

_UUID = re.compile(r"[A-Za-z0-9][A-Za-z0-9\-]{0,127}")


@dataclass(frozen=True, kw_only=True)
class WatchSettings:
    connection: Connection  # the target and its TLS
    json: bool
    retry: bool  # keep trying a server never reached (else exit 1 at the first failure)
    dra: DraVersion | None  # None: capwatch.v1 Watch
    since: int
    heartbeat_s: float | None  # None: the agent's cycle interval (the controller's 10 s)
    count: int | None  # stop after this many messages; None: never
    indexes: tuple[int, ...]
    uuids: tuple[str, ...]
    cluster: bool = False  # a controller's ClusterHealthService, not an agent's stream
    instance: str = ""  # the server instance --since belongs to ("": the one serving)
    node: str = ""  # the node the agent must serve, or a pool's node to follow ("": any)
    log_level: str = "WARNING"  # the client's own log (reconnects: INFO)
    log_format: LogFormat = LogFormat.TEXT

    @property
    def target(self) -> str:
        return self.connection.target


def _node(flag: str, text: str) -> str:
    return node_name(flag, text) if text else text


def _count(flag: str, text: str) -> int | None:
    if not text:
        return None
    if not is_digits(text) or int(text) < 1:
        raise ConfigError(flag, f"must be a positive integer, got {text!r}")
    return int(text)


def _since(flag: str, text: str) -> int:
    if not is_digits(text):
        raise ConfigError(flag, f"must be a cycle sequence number (0 or more), got {text!r}")
    return int(text)


def _heartbeat(flag: str, text: str) -> float | None:
    if not text:
        return None
    try:
        value = float(text)
    except ValueError as exc:
        raise ConfigError(flag, f"not a number: {text!r}") from exc
    if not MIN_HEARTBEAT_S <= value <= MAX_HEARTBEAT_S:
        raise ConfigError(
            flag, f"must be between {MIN_HEARTBEAT_S} and {MAX_HEARTBEAT_S:g} seconds, got {text!r}"
        )
    return value


def _instance(flag: str, text: str) -> str:
    if text and not _UUID.fullmatch(text):
        raise ConfigError(flag, f"expected an instance id (as a snapshot names it), got {text!r}")
    return text


def _gpu(flag: str, text: str) -> int | str:
    if is_digits(text):
        return int(text)
    if not _UUID.fullmatch(text):
        raise ConfigError(flag, f"expected a GPU index or UUID, got {text!r}")
    return text


def _switch(flag: str, text: str) -> bool:
    value = text.lower()
    if value not in {"", "0", "1", "true", "false", "yes", "no"}:
        raise ConfigError(flag, f"must be true or false, got {text!r}")
    return value in {"1", "true", "yes"}


def _dra(flag: str, text: str) -> DraVersion | None:
    return enum_choice(DraVersion)(flag, text) if text else None


_JSON = Option(
    flag="--json",
    env="CAPWATCH_WATCH_JSON",
    default="false",
    convert=_switch,
    help="print each message as one JSON object per line",
    switch=True,
)
_RETRY = Option(
    flag="--retry",
    env="CAPWATCH_WATCH_RETRY",
    default="false",
    convert=_switch,
    help="keep trying an agent that cannot be reached at first (default: exit 1 saying why)",
    switch=True,
)
_CLUSTER = Option(
    flag="--cluster",
    env="CAPWATCH_WATCH_CLUSTER",
    default="false",
    convert=_switch,
    help="follow a capwatch controller's cluster stream at --target (host:port, its gRPC "
    "port 50052): one row per node",
    switch=True,
)
_SWITCHES = (_JSON, _RETRY, _CLUSTER)

_OPTIONS = (
    *CONNECTION_OPTIONS,
    Option(
        flag="--dra",
        env="CAPWATCH_WATCH_DRA",
        default="",
        convert=_dra,
        help="watch the DRA-shaped health mirror instead: v1 or v1alpha1",
    ),
    Option(
        flag="--since",
        env="CAPWATCH_WATCH_SINCE",
        default="0",
        convert=_since,
        help="resume after this cycle (with --cluster: update) sequence number "
        "(0: start with a snapshot)",
    ),
    Option(
        flag="--instance",
        env="CAPWATCH_WATCH_INSTANCE",
        default="",
        convert=_instance,
        help="the agent (or controller) instance --since belongs to; another instance "
        "answers with a resync (default: the one serving)",
    ),
    Option(
        flag="--heartbeat",
        env="CAPWATCH_WATCH_HEARTBEAT",
        default="",
        convert=_heartbeat,
        help="seconds between heartbeats when nothing new happens (default: the agent's "
        "interval; the controller's 10 s with --cluster)",
    ),
    Option(
        flag="--node",
        env="CAPWATCH_WATCH_NODE",
        default="",
        convert=_node,
        help="the node to follow: a pool's node (capwatch pool), or the node the agent "
        "must be serving (it refuses another)",
    ),
    Option(
        flag="--count",
        env="CAPWATCH_WATCH_COUNT",
        default="",
        convert=_count,
        help="exit after this many messages",
    ),
    Option(
        flag="--gpu",
        env="CAPWATCH_WATCH_GPUS",
        default="",
        convert=_gpu,
        repeatable=True,
        help="show only this GPU (index or UUID), repeatable",
    ),
    log_level_option("warning"),
    LOG_FORMAT_OPTION,
)


def add_watch_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser, (*_OPTIONS, *_SWITCHES))


def watch_settings(namespace: argparse.Namespace, environ: Mapping[str, str]) -> WatchSettings:
    values = read_options(namespace, environ, (*_OPTIONS, *_SWITCHES))
    gpus: tuple[int | str, ...] = values["gpu"]
    settings = WatchSettings(
        connection=connection(values),
        json=values["json"],
        retry=values["retry"],
        dra=values["dra"],
        since=values["since"],
        heartbeat_s=values["heartbeat"],
        count=values["count"],
        cluster=values["cluster"],
        instance=values["instance"],
        node=values["node"],
        indexes=tuple(g for g in gpus if isinstance(g, int)),
        uuids=tuple(g for g in gpus if isinstance(g, str)),
        log_level=values["log_level"],
        log_format=values["log_format"],
    )
    if settings.instance and settings.since == 0:
        raise ConfigError("--instance", "needs --since (the sequence to resume after)")
    if settings.dra is not None:
        for flag, used in (
            ("--since", settings.since != 0),
            ("--instance", bool(settings.instance)),
            ("--heartbeat", settings.heartbeat_s is not None),
            ("--gpu", bool(gpus)),
            ("--node", bool(settings.node)),
        ):
            if used:
                raise ConfigError(flag, "applies to the capwatch.v1 stream, not to --dra")
    if settings.cluster:
        _check_cluster(settings, dra=settings.dra is not None, gpus=bool(gpus))
    return settings


def _check_cluster(settings: WatchSettings, *, dra: bool, gpus: bool) -> None:
    for flag, used in (("--dra", dra), ("--gpu", gpus), ("--node", bool(settings.node))):
        if used:
            raise ConfigError(flag, "applies to a node agent's stream, not to --cluster")
    if settings.target == DEFAULT_TARGET:
        # The default is the agent's socket; a controller is reached over TCP.
        raise ConfigError(
            "--target", "--cluster needs the controller's host:port (its gRPC port, 50052)"
        )


def client_for(settings: WatchSettings) -> NodeHealthClient:
    """A client for ``settings``' target, TLS and filter. Raises ConfigError."""
    return NodeHealthClient(
        **settings.connection.arguments(),
        node_name=settings.node,
        heartbeat_interval=settings.heartbeat_s,
        indexes=settings.indexes,
        uuids=settings.uuids,
    )


def cluster_client_for(settings: WatchSettings) -> ClusterHealthClient:
    """A client for the controller at ``settings``' target, with its TLS. Raises ConfigError."""
    return ClusterHealthClient(
        **settings.connection.arguments(), heartbeat_interval=settings.heartbeat_s
    )
