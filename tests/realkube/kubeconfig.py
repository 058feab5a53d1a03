"""Kubeconfig files for the loopback control plane: one cluster, one user, CA inline."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from pathlib import Path

import yaml

from tests.realkube.pki import KeyPair

CLUSTER = "capwatch-realkube"


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode("ascii")


def render(
    server: str,
    ca: Path,
    user: str,
    credentials: Mapping[str, str],
    namespace: str | None = None,
) -> str:
    """A kubeconfig for user at server, trusting ca; credentials is the user stanza
    (client-certificate-data/client-key-data, or token). Everything is inline, so the
    file can be copied anywhere."""
    context: dict[str, str] = {"cluster": CLUSTER, "user": user}
    if namespace is not None:
        context["namespace"] = namespace
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": CLUSTER, "cluster": {"server": server, "certificate-authority-data": b64(ca)}}
        ],
        "users": [{"name": user, "user": dict(credentials)}],
        "contexts": [{"name": f"{user}@{CLUSTER}", "context": context}],
        "current-context": f"{user}@{CLUSTER}",
    }
    text: str = yaml.safe_dump(document, sort_keys=False)
    return text


def client_credentials(pair: KeyPair) -> dict[str, str]:
    """The user stanza for a client certificate."""
    return {"client-certificate-data": b64(pair.cert), "client-key-data": b64(pair.key)}


def write_private(path: Path, text: str) -> Path:
    """Write a file that holds credentials, readable by its owner alone."""
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(text, encoding="utf-8")
    return path
