"""How this process reaches its API server: the in-cluster service account, or a kubeconfig.

capwatch speaks to the API server in raw JSON over urllib3 (:mod:`capwatch.kube.transport`),
so it does not load a Kubernetes client library: the ``kubernetes`` package costs a
process about 21 MiB of resident memory for models capwatch never builds (the
controller's budget at 5,000 nodes is 512 MiB; docs/scale.md). What it took from
that package is this: where the server is, what to trust, who to be.

In-cluster (``KUBERNETES_SERVICE_HOST`` set), as client-go's ``InClusterConfig``:
the service's host and port, the service account's CA, and its token file, which
the kubelet rotates (the transport re-reads it, :data:`TOKEN_REREAD_S`).

A kubeconfig (``--kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``):
the current context's cluster and user. ``$KUBECONFIG`` may list several files,
merged as kubectl merges them (the first file to name a cluster, user or context,
or to set the current context, wins). Paths in a file are relative to that file.
The server's CA (``certificate-authority`` or ``-data``), ``tls-server-name``,
``insecure-skip-tls-verify``; the user's client certificate and key (file or
data), ``token``, ``tokenFile``, or ``username``/``password``. Credential plugins
(``exec``, ``auth-provider``) and proxies are refused with one line: capwatch
runs no helper programs, and a silently ignored setting would send requests
somewhere, or as someone, the file did not say.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from capwatch.kit.errors import ConfigError

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_S = 60.0  # client-go re-reads a rotated token at most once a minute


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterAccess:
    """The API server's address and this process's credentials for it (PEM as bytes)."""

    server: str  # https://host:port, with any path prefix a proxy puts before /api
    ca_pem: bytes | None = None  # None: the system's trust store
    tls_server_name: str | None = None  # the name to expect on the server's certificate
    insecure: bool = False  # no verification of the server at all (the kubeconfig said so)
    client_cert_pem: bytes | None = None
    client_key_pem: bytes | None = None
    token: str | None = None
    token_file: str | None = None  # re-read: bound service-account tokens rotate
    basic_auth: str | None = None  # "user:password"
    source: str = ""  # "in-cluster" or the kubeconfig's path, for messages


def from_environment(kubeconfig: str | None) -> ClusterAccess:
    """In-cluster access when ``KUBERNETES_SERVICE_HOST`` is set, else the kubeconfig's.

    Anything missing or malformed is a :class:`~capwatch.kit.errors.ConfigError` naming
    ``in-cluster`` or ``--kubeconfig``, with the cause chained.
    """
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return in_cluster(os.environ)
    return from_kubeconfig(kubeconfig, os.environ)


def in_cluster(env: Mapping[str, str], *, account: Path = SERVICE_ACCOUNT) -> ClusterAccess:
    """The pod's service account, and the API server's service from its environment."""
    host = env.get("KUBERNETES_SERVICE_HOST", "")
    port = env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ConfigError(
            "in-cluster", "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must both be set"
        )
    token_file = account / "token"
    try:
        ca = (account / "ca.crt").read_bytes()
        token_file.read_text()  # readable now, or not at all
    except OSError as err:
        raise ConfigError(
            "in-cluster", f"cannot read the service account's credentials: {err}"
        ) from err
    return ClusterAccess(
        server=f"https://{_host(host)}:{port}",
        ca_pem=ca,
        token_file=str(token_file),
        source="in-cluster",
    )


def from_kubeconfig(path: str | None, env: Mapping[str, str]) -> ClusterAccess:
    """The current context of the kubeconfig at ``path`` (None: ``$KUBECONFIG``, then
    ``~/.kube/config``)."""
    if path:
        files = [Path(path)]
    elif env.get("KUBECONFIG"):
        files = [Path(p) for p in env["KUBECONFIG"].split(os.pathsep) if p]
    else:
        files = [Path.home() / ".kube" / "config"]
    where = ", ".join(str(f) for f in files)
    try:
        return _resolve(_merged(files, explicit=bool(path)), where)
    except ConfigError:
        raise
    except (OSError, yaml.YAMLError, ValueError, TypeError, binascii.Error) as err:
        raise ConfigError("--kubeconfig", f"cannot load {where}: {err}") from err


class _Merged:
    """The named maps of one or more kubeconfig files, first definition winning."""

    def __init__(self) -> None:
        self.clusters: dict[str, tuple[Mapping[str, Any], Path]] = {}
        self.users: dict[str, tuple[Mapping[str, Any], Path]] = {}
        self.contexts: dict[str, Mapping[str, Any]] = {}
        self.current = ""


def _merged(files: list[Path], *, explicit: bool) -> _Merged:
    merged = _Merged()
    found = False
    for file in files:
        if not explicit and not file.exists():
            continue  # kubectl skips a missing file of $KUBECONFIG's list
        text = file.read_text()  # an explicit path that is missing raises here
        found = True
        document = yaml.safe_load(text) or {}
        if not isinstance(document, Mapping):
            raise ValueError(f"{file} is not a kubeconfig (not a mapping)")
        base = file.resolve().parent
        for key, into, field in (
            ("clusters", merged.clusters, "cluster"),
            ("users", merged.users, "user"),
        ):
            for entry in document.get(key) or []:
                name = str(_mapping(entry).get("name", ""))
                into.setdefault(name, (_mapping(_mapping(entry).get(field)), base))
        for entry in document.get("contexts") or []:
            name = str(_mapping(entry).get("name", ""))
            merged.contexts.setdefault(name, _mapping(_mapping(entry).get("context")))
        merged.current = merged.current or str(document.get("current-context") or "")
    if not found:
        raise FileNotFoundError(f"no kubeconfig at {', '.join(str(f) for f in files)}")
    return merged


def _resolve(merged: _Merged, where: str) -> ClusterAccess:
    if not merged.current:
        raise ConfigError("--kubeconfig", f"{where} sets no current-context")
    context = merged.contexts.get(merged.current)
    if context is None:
        raise ConfigError("--kubeconfig", f"{where}: no context named {merged.current!r}")
    cluster_name = str(context.get("cluster", ""))
    if cluster_name not in merged.clusters:
        raise ConfigError("--kubeconfig", f"{where}: no cluster named {cluster_name!r}")
    cluster, cluster_base = merged.clusters[cluster_name]
    user_name = str(context.get("user", ""))
    user, user_base = merged.users.get(user_name, ({}, cluster_base))
    server = str(cluster.get("server") or "")
    if not server.startswith(("https://", "http://")):
        raise ConfigError(
            "--kubeconfig", f"{where}: cluster {cluster_name!r} has no http(s) server: {server!r}"
        )
    if cluster.get("proxy-url"):
        raise ConfigError(
            "--kubeconfig",
            f"{where}: cluster {cluster_name!r} sets proxy-url, which capwatch does not support",
        )
    for plugin in ("exec", "auth-provider"):
        if user.get(plugin):
            raise ConfigError(
                "--kubeconfig",
                f"{where}: user {user_name!r} authenticates with an {plugin} plugin, which "
                "capwatch does not run; give it a token, token file or client certificate",
            )
    basic = None
    if user.get("username") or user.get("password"):
        basic = f"{user.get('username', '')}:{user.get('password', '')}"
    token_file = user.get("tokenFile")
    return ClusterAccess(
        server=server.rstrip("/"),
        ca_pem=_pem(cluster, "certificate-authority", cluster_base),
        tls_server_name=str(cluster["tls-server-name"]) if cluster.get("tls-server-name") else None,
        insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
        client_cert_pem=_pem(user, "client-certificate", user_base),
        client_key_pem=_pem(user, "client-key", user_base),
        token=str(user["token"]) if user.get("token") else None,
        token_file=str(user_base / str(token_file)) if token_file else None,
        basic_auth=basic,
        source=where,
    )


def _pem(section: Mapping[str, Any], key: str, base: Path) -> bytes | None:
    """``key-data`` (base64 PEM) or the file ``key`` names (relative to the kubeconfig)."""
    data = section.get(f"{key}-data")
    if data:
        return base64.b64decode(str(data), validate=True)
    if section.get(key):
        return (base / str(section[key])).read_bytes()
    return None


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _host(host: str) -> str:
    """An IPv6 address in brackets, as a URL needs it."""
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host
