"""How a subscriber reaches a server: the target and its TLS, as flags with twins.

``capwatch watch`` and ``capwatch shim`` take the same connection flags
(``--target``, ``--tls-*``), validated here the same way; the clients take the
:meth:`Connection.arguments` they make.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capwatch.api.endpoints import AGENT_SOCKET
from capwatch.kit.addresses import host_port
from capwatch.kit.errors import ConfigError
from capwatch.kit.flags import Option, optional_path
from capwatch.kit.tls import ca_flag, pair_flags

DEFAULT_TARGET = f"unix://{AGENT_SOCKET}"


@dataclass(frozen=True, kw_only=True)
class Connection:
    target: str  # unix:///path or host:port
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_server_name: str | None = None

    @property
    def tls(self) -> bool:
        return self.tls_ca is not None or self.tls_cert is not None

    def arguments(self) -> dict[str, Any]:
        """The target and TLS arguments every client takes, the files read now.
        Raises ConfigError naming the flag of a file that cannot be read."""
        options: list[tuple[str, Any]] = []
        if self.tls_server_name:
            options.append(("grpc.ssl_target_name_override", self.tls_server_name))
        return {
            "target": self.target,
            "root_certificates": _read("--tls-ca", self.tls_ca),
            "certificate_chain": _read("--tls-cert", self.tls_cert),
            "private_key": _read("--tls-key", self.tls_key),
            "options": options,
        }


def _target(flag: str, text: str) -> str:
    if text.startswith("unix://"):
        if not text.removeprefix("unix://").startswith("/"):
            raise ConfigError(flag, f"unix socket path must be absolute: {text!r}")
        return text
    parsed = host_port(text)
    if parsed is None or not parsed[0] or parsed[1] == 0:
        raise ConfigError(flag, f"expected unix:///path or host:port, got {text!r}")
    return text


def _server_name(flag: str, text: str) -> str | None:
    if text and not re.fullmatch(r"[A-Za-z0-9.\-]{1,253}", text):
        raise ConfigError(flag, f"not a host name: {text!r}")
    return text or None


CONNECTION_OPTIONS = (
    Option(
        flag="--target",
        env="CAPWATCH_TARGET",
        default=DEFAULT_TARGET,
        convert=_target,
        help="the agent: unix:///path or host:port",
    ),
    Option(
        flag="--tls-ca",
        env="CAPWATCH_TLS_CA",
        default="",
        convert=optional_path,
        help="PEM CA bundle to verify a TCP agent's certificate (turns TLS on)",
    ),
    Option(
        flag="--tls-cert",
        env="CAPWATCH_TLS_CERT",
        default="",
        convert=optional_path,
        help="PEM client certificate for mutual TLS (turns TLS on)",
    ),
    Option(
        flag="--tls-key",
        env="CAPWATCH_TLS_KEY",
        default="",
        convert=optional_path,
        help="PEM private key for --tls-cert",
    ),
    Option(
        flag="--tls-server-name",
        env="CAPWATCH_TLS_SERVER_NAME",
        default="",
        convert=_server_name,
        help="name the agent's certificate must carry (default: the target's host)",
    ),
)


def connection(values: Mapping[str, Any]) -> Connection:
    """The connection from :data:`CONNECTION_OPTIONS`' values (``read_options``), checked
    as a whole: TLS only over TCP, cert and key together, every file usable PEM."""
    made = Connection(
        target=values["target"],
        tls_ca=values["tls_ca"],
        tls_cert=values["tls_cert"],
        tls_key=values["tls_key"],
        tls_server_name=values["tls_server_name"],
    )
    if (made.tls_cert is None) != (made.tls_key is None):
        raise ConfigError("--tls-cert", "--tls-cert and --tls-key go together")
    if made.tls and made.target.startswith("unix://"):
        raise ConfigError(
            "--tls-ca" if made.tls_ca else "--tls-cert",
            "TLS is for TCP targets; the agent's unix socket is protected by file modes",
        )
    if made.tls_server_name and not made.tls:
        raise ConfigError("--tls-server-name", "needs TLS (--tls-ca or --tls-cert)")
    # PEM that loads, and a key that fits its certificate: checked as gRPC will use them,
    # so a bad file is one line now, not every connection failing later.
    if made.tls_ca is not None:
        ca_flag("--tls-ca", made.tls_ca)
    if made.tls_cert is not None and made.tls_key is not None:
        pair_flags("--tls-cert", made.tls_cert, "--tls-key", made.tls_key)
    return made


def _read(flag: str, path: Path | None) -> bytes | None:
    try:
        return None if path is None else path.read_bytes()
    except OSError as exc:
        raise ConfigError(flag, f"cannot read {path}: {exc.strerror}") from exc
