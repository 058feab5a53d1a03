"""The protocol edge's configuration: gRPC listeners, TLS, DRA naming, limits, metrics.

Built the same way as the agent's settings (kit/flags.py): every flag has an
environment twin and every value is validated before anything starts.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from capwatch.api.endpoints import AGENT_PORT, AGENT_SOCKET
from capwatch.kit.addresses import host_port, listen_address
from capwatch.kit.errors import ConfigError
from capwatch.kit.flags import Option, add_options, is_digits, optional_path, read_options
from capwatch.kit.names import is_dns_label, is_dns_subdomain
from capwatch.kit.tls import ca_flag, pair_flags

DEFAULT_LISTEN = (f"unix://{AGENT_SOCKET}", f"0.0.0.0:{AGENT_PORT}")
DEFAULT_DEVICE_NAME = "gpu-{index}"
MAX_SUBSCRIBERS = 20_000
DEFAULT_RESERVED_LOCAL = 16  # the shim needs one; the rest for DRA clients and operators
DEFAULT_MAX_PER_PEER = 64  # a few controllers and dashboards per address, with room
DEFAULT_METRICS_PORT = 9400
# Prometheus scrapes from another pod, so the default is every interface.
DEFAULT_METRICS_ADDRESS = "0.0.0.0"  # noqa: S104


@dataclass(frozen=True, kw_only=True)
class Listener:
    """One address to serve on: a unix socket path, or host:port over TCP."""

    address: str  # as grpc wants it: "unix:///path" or "host:port"
    unix_path: Path | None = None


@dataclass(frozen=True, kw_only=True)
class TlsFiles:
    cert: Path
    key: Path
    client_ca: Path | None  # set: mutual TLS, clients must present a cert it signed


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    listeners: tuple[Listener, ...]
    tls: TlsFiles | None  # applies to TCP listeners; the unix socket relies on file modes
    socket_group: str | None  # group owning the unix socket (mode 0660)
    dra_pool_name: str | None  # None: the node name
    dra_device_name: str  # template with {index} and/or {uuid}
    max_subscribers: int
    grace_s: float  # for in-flight RPCs at shutdown
    # Of max_subscribers, slots only unix-socket clients may take (server/admission.py).
    reserved_local_subscribers: int = DEFAULT_RESERVED_LOCAL
    max_streams_per_peer: int = DEFAULT_MAX_PER_PEER  # per TCP client address
    metrics_port: int | None = None  # None: no metrics endpoint (--metrics-port 0)
    metrics_address: str = DEFAULT_METRICS_ADDRESS

    def device_namer(self) -> DeviceNamerTemplate:
        return DeviceNamerTemplate(self.dra_device_name)


@dataclass(frozen=True)
class DeviceNamerTemplate:
    """DRA device names from a template: ``gpu-{index}`` by default, or ``{uuid}``-based."""

    template: str

    def __call__(self, index: int, uuid: str | None) -> str:
        return self.template.format(index=index, uuid=(uuid or f"unknown-{index}").lower())


def _listener(flag: str, text: str) -> Listener:
    if text.startswith("unix://"):
        path = Path(text.removeprefix("unix://"))
        if not path.is_absolute():
            raise ConfigError(flag, f"unix socket path must be absolute: {text!r}")
        return Listener(address=f"unix://{path}", unix_path=path)
    if host_port(text) is None:
        raise ConfigError(flag, f"expected unix:///path or host:port, got {text!r}")
    return Listener(address=text)


def _device_template(flag: str, text: str) -> str:
    try:
        sample = text.format(index=0, uuid="gpu-00000000-0000-0000-0000-000000000000")
    # {index[0]} and {index.x} fail with TypeError and AttributeError.
    except (KeyError, IndexError, ValueError, TypeError, AttributeError) as exc:
        raise ConfigError(flag, f"template may use only {{index}} and {{uuid}}: {text!r}") from exc
    other = text.format(index=1, uuid="gpu-00000000-0000-0000-0000-000000000001")
    if other == sample:
        raise ConfigError(flag, "template must use {index} or {uuid} to tell GPUs apart")
    if not is_dns_label(sample):
        raise ConfigError(flag, f"{text!r} does not give a DNS label (a DRA device name)")
    return text


def _pool_name(flag: str, text: str) -> str | None:
    if not text:
        return None
    if not is_dns_subdomain(text):
        raise ConfigError(flag, f"not a valid DRA pool name: {text!r}")
    return text


def _subscribers(flag: str, text: str) -> int:
    if not is_digits(text) or not 1 <= int(text) <= MAX_SUBSCRIBERS:
        raise ConfigError(flag, f"must be an integer from 1 to {MAX_SUBSCRIBERS}, got {text!r}")
    return int(text)


def _reserved(flag: str, text: str) -> int:
    if not is_digits(text) or int(text) >= MAX_SUBSCRIBERS:
        raise ConfigError(flag, f"must be an integer from 0 to {MAX_SUBSCRIBERS - 1}, got {text!r}")
    return int(text)


def _grace(flag: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise ConfigError(flag, f"not a number: {text!r}") from exc
    if not 0 <= value <= 300:
        raise ConfigError(flag, f"must be between 0 and 300 seconds, got {text!r}")
    return value


def _metrics_port(flag: str, text: str) -> int | None:
    if not is_digits(text) or not 0 <= int(text) <= 65535:
        raise ConfigError(flag, f"must be a port from 0 (metrics off) to 65535, got {text!r}")
    return int(text) or None


def _group(flag: str, text: str) -> str | None:
    if text and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}", text):
        raise ConfigError(flag, f"not a group name or id: {text!r}")
    return text or None


_OPTIONS = (
    Option(
        flag="--grpc-listen",
        env="CAPWATCH_GRPC_LISTEN",
        default=",".join(DEFAULT_LISTEN),
        convert=_listener,
        repeatable=True,
        help="address to serve gRPC on, repeatable: unix:///path or host:port",
    ),
    Option(
        flag="--grpc-tls-cert",
        env="CAPWATCH_GRPC_TLS_CERT",
        default="",
        convert=optional_path,
        help="PEM certificate for TCP listeners (TLS off when unset)",
    ),
    Option(
        flag="--grpc-tls-key",
        env="CAPWATCH_GRPC_TLS_KEY",
        default="",
        convert=optional_path,
        help="PEM private key for --grpc-tls-cert",
    ),
    Option(
        flag="--grpc-tls-client-ca",
        env="CAPWATCH_GRPC_TLS_CLIENT_CA",
        default="",
        convert=optional_path,
        help="PEM CA bundle; when set, TCP clients must present a certificate it signed",
    ),
    Option(
        flag="--grpc-socket-group",
        env="CAPWATCH_GRPC_SOCKET_GROUP",
        default="",
        convert=_group,
        help="group given access to the unix socket (mode 0660)",
    ),
    Option(
        flag="--dra-pool-name",
        env="CAPWATCH_DRA_POOL_NAME",
        default="",
        convert=_pool_name,
        help="pool_name in the DRA health mirrors (default: the node name)",
    ),
    Option(
        flag="--dra-device-name",
        env="CAPWATCH_DRA_DEVICE_NAME",
        default=DEFAULT_DEVICE_NAME,
        convert=_device_template,
        help="device_name template in the DRA health mirrors: {index}, {uuid}",
    ),
    Option(
        flag="--grpc-max-subscribers",
        env="CAPWATCH_GRPC_MAX_SUBSCRIBERS",
        default="10000",
        convert=_subscribers,
        help="concurrent Watch and NodeWatchResources streams; more get RESOURCE_EXHAUSTED",
    ),
    Option(
        flag="--grpc-reserved-local-subscribers",
        env="CAPWATCH_GRPC_RESERVED_LOCAL_SUBSCRIBERS",
        default=str(DEFAULT_RESERVED_LOCAL),
        convert=_reserved,
        help="of --grpc-max-subscribers, slots kept for unix-socket clients (the readiness shim)",
    ),
    Option(
        flag="--grpc-max-streams-per-peer",
        env="CAPWATCH_GRPC_MAX_STREAMS_PER_PEER",
        default=str(DEFAULT_MAX_PER_PEER),
        convert=_subscribers,
        help="streams one TCP client address may hold; more get RESOURCE_EXHAUSTED",
    ),
    Option(
        flag="--grpc-grace",
        env="CAPWATCH_GRPC_GRACE",
        default="5",
        convert=_grace,
        help="seconds in-flight RPCs get to finish at shutdown",
    ),
    Option(
        flag="--metrics-port",
        env="CAPWATCH_METRICS_PORT",
        default=str(DEFAULT_METRICS_PORT),
        convert=_metrics_port,
        help="port for Prometheus metrics at /metrics; 0 turns metrics (only) off",
    ),
    Option(
        flag="--metrics-address",
        env="CAPWATCH_METRICS_ADDRESS",
        default=DEFAULT_METRICS_ADDRESS,
        convert=listen_address,
        help="address the metrics endpoint listens on",
    ),
)


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser, _OPTIONS)


def server_settings(namespace: argparse.Namespace, environ: Mapping[str, str]) -> ServerSettings:
    values = read_options(namespace, environ, _OPTIONS)
    listeners: tuple[Listener, ...] = values["grpc_listen"]
    if not listeners:
        raise ConfigError("--grpc-listen", "at least one address is required")
    if len({listener.address for listener in listeners}) != len(listeners):
        raise ConfigError("--grpc-listen", "the same address is given twice")
    cert, key, client_ca = (
        values["grpc_tls_cert"],
        values["grpc_tls_key"],
        values["grpc_tls_client_ca"],
    )
    tls = None
    if (cert is None) != (key is None):
        raise ConfigError("--grpc-tls-cert", "--grpc-tls-cert and --grpc-tls-key go together")
    if client_ca is not None and cert is None:
        raise ConfigError(
            "--grpc-tls-client-ca", "mutual TLS needs --grpc-tls-cert and --grpc-tls-key"
        )
    if cert is not None and key is not None:
        # Loaded as grpc will load them: a file that is not PEM is one line now.
        pair_flags("--grpc-tls-cert", cert, "--grpc-tls-key", key)
        if client_ca is not None:
            ca_flag("--grpc-tls-client-ca", client_ca)
        tls = TlsFiles(cert=cert, key=key, client_ca=client_ca)
    max_subscribers, reserved = (
        values["grpc_max_subscribers"],
        values["grpc_reserved_local_subscribers"],
    )
    if reserved >= max_subscribers:
        raise ConfigError(
            "--grpc-reserved-local-subscribers",
            f"must be less than --grpc-max-subscribers ({max_subscribers}), got {reserved}",
        )
    return ServerSettings(
        listeners=listeners,
        tls=tls,
        socket_group=values["grpc_socket_group"],
        dra_pool_name=values["dra_pool_name"],
        dra_device_name=values["dra_device_name"],
        max_subscribers=max_subscribers,
        grace_s=values["grpc_grace"],
        reserved_local_subscribers=reserved,
        max_streams_per_peer=values["grpc_max_streams_per_peer"],
        metrics_port=values["metrics_port"],
        metrics_address=values["metrics_address"],
    )
