"""``capwatch demo``'s configuration: its flags, their environment twins, one frozen value.

Every flag has a twin (``CAPWATCH_INTERVAL``, ``CAPWATCH_READYZ_PORT``...), as the
agent's do; a bad value is a one-line configuration error before anything starts.
``--cluster`` switches to the cluster demo (capwatch/demo/cluster.py), which takes
fewer of them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capwatch.agent.settings import MAX_INTERVAL_S
from capwatch.kit.addresses import host_port
from capwatch.kit.errors import CapwatchError, ConfigError
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
)

DEFAULT_DEMO_LISTEN = "127.0.0.1:50051"
DEFAULT_CLUSTER_LISTEN = "127.0.0.1:50052"
MIN_CLUSTER_INTERVAL_S = 0.1
DEFAULT_READYZ_PORT = 8081
DEFAULT_METRICS_PORT = 9400


class DemoError(CapwatchError):
    """A part of the demo could not be started, or died."""


@dataclass(frozen=True, kw_only=True)
class DemoSettings:
    scenario: Path | None  # None: the built-in scenario
    interval_s: float | None  # None: the scenario's
    cycles: int | None  # None: until stopped
    grpc_listen: tuple[str, ...]
    readyz_port: int  # 0: a free one
    metrics_port: int | None  # None: no metrics
    log_level: str
    log_format: LogFormat
    # --cluster (capwatch/demo/cluster.py): a pool at grpc_listen, a controller at this.
    cluster: bool = False
    cluster_listen: str = DEFAULT_CLUSTER_LISTEN


def _interval(flag: str, text: str) -> float | None:
    if not text:
        return None
    value = positive_float(flag, text)
    if value > MAX_INTERVAL_S:
        raise ConfigError(flag, f"must be at most {MAX_INTERVAL_S:g} seconds, got {text!r}")
    return value


def _cycles(flag: str, text: str) -> int | None:
    if not text:
        return None
    if not is_digits(text) or int(text) < 1:
        raise ConfigError(flag, f"must be a positive integer, got {text!r}")
    return int(text)


def _listen(flag: str, text: str) -> str:
    if text.startswith("unix://") and text.removeprefix("unix://").startswith("/"):
        return text
    if host_port(text) is None:
        raise ConfigError(flag, f"expected unix:///path or host:port, got {text!r}")
    return text


def _host_port(flag: str, text: str) -> str:
    if host_port(text) is None:
        raise ConfigError(flag, f"expected host:port, got {text!r}")
    return text


def _port(off: str) -> Callable[[str, str], int]:
    def convert(flag: str, text: str) -> int:
        if not is_digits(text) or int(text) > 65535:
            raise ConfigError(flag, f"must be a port from 0 ({off}) to 65535, got {text!r}")
        return int(text)

    return convert


_OPTIONS = (
    Option(
        flag="--scenario",
        env="CAPWATCH_SCENARIO",
        default="",
        convert=optional_path,
        help="scenario file (default: the built-in scenario)",
    ),
    Option(
        flag="--interval",
        env="CAPWATCH_INTERVAL",
        default="",
        convert=_interval,
        help="seconds between cycles (default: the scenario's)",
    ),
    Option(
        flag="--cycles",
        env="CAPWATCH_DEMO_CYCLES",
        default="",
        convert=_cycles,
        help="stop after this many cycles",
    ),
    Option(
        flag="--grpc-listen",
        env="CAPWATCH_GRPC_LISTEN",
        default=DEFAULT_DEMO_LISTEN,
        convert=_listen,
        repeatable=True,
        help="address to serve the stream on, repeatable (host:0 picks a free port)",
    ),
    Option(
        flag="--readyz-port",
        env="CAPWATCH_READYZ_PORT",
        default=str(DEFAULT_READYZ_PORT),
        convert=_port("a free one"),
        help="port of the shim's /readyz on 127.0.0.1 (0 picks a free one)",
    ),
    Option(
        flag="--metrics-port",
        env="CAPWATCH_METRICS_PORT",
        default=str(DEFAULT_METRICS_PORT),
        convert=_port("metrics off"),
        help="port of the metrics on 127.0.0.1 (0 turns them off)",
    ),
    Option(
        flag="--cluster",
        env="CAPWATCH_DEMO_CLUSTER",
        default="false",
        convert=boolean,
        help="the cluster demo instead: a pool of 12 simulated nodes, a controller in "
        "--dry-run following them, and every node's condition (--readyz-port and "
        "--metrics-port are not used)",
        switch=True,
    ),
    Option(
        flag="--cluster-listen",
        env="CAPWATCH_DEMO_CLUSTER_LISTEN",
        default=DEFAULT_CLUSTER_LISTEN,
        convert=_host_port,
        help="with --cluster: where the controller serves the cluster stream (host:0 picks "
        "a free port)",
    ),
    log_level_option("error"),  # the tables say what the warnings would
    LOG_FORMAT_OPTION,
)


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser, _OPTIONS)


def demo_settings(namespace: argparse.Namespace, environ: Mapping[str, str]) -> DemoSettings:
    values = read_options(namespace, environ, _OPTIONS)
    if values["cluster"]:
        _check_cluster(values)
    elif values["scenario"] is not None and not values["scenario"].is_file():
        raise ConfigError("--scenario", f"{values['scenario']} is not a readable file")
    return DemoSettings(
        scenario=values["scenario"],
        interval_s=values["interval"],
        cycles=values["cycles"],
        grpc_listen=values["grpc_listen"],
        readyz_port=values["readyz_port"],
        metrics_port=values["metrics_port"] or None,
        log_level=values["log_level"],
        log_format=values["log_format"],
        cluster=values["cluster"],
        cluster_listen=values["cluster_listen"],
    )


def _check_cluster(values: Mapping[str, Any]) -> None:
    """The pool makes each node's scenario, serves on one address and runs until stopped."""
    for flag in ("scenario", "cycles"):
        if values[flag] is not None:
            raise ConfigError(f"--{flag}", "not with --cluster")
    listen = values["grpc_listen"]
    if len(listen) != 1 or host_port(listen[0]) is None:
        raise ConfigError("--grpc-listen", "with --cluster: one host:port, where the pool serves")
    interval = values["interval"]
    if interval is not None and interval < MIN_CLUSTER_INTERVAL_S:
        raise ConfigError(
            "--interval", f"must be at least {MIN_CLUSTER_INTERVAL_S:g}s with --cluster"
        )
