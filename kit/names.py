"""Kubernetes object names: the one rule for node names, and the DNS forms it rests on.

A Node's name is an RFC 1123 DNS subdomain: at most 253 characters of
lower-case alphanumerics, ``-`` and ``.``, each dot-separated label starting
and ending with an alphanumeric. Every flag, file and request that names a
node is checked here, so the agent, the pool, ``capwatch watch`` and the
controller accept exactly the same names.
"""

from __future__ import annotations

import re

from capwatch.kit.errors import ConfigError

MAX_SUBDOMAIN = 253
MAX_LABEL = 63
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def is_dns_subdomain(text: str) -> bool:
    """RFC 1123 subdomain: what Kubernetes requires of a Node's (and most objects') name."""
    return len(text) <= MAX_SUBDOMAIN and _SUBDOMAIN.fullmatch(text) is not None


def is_dns_label(text: str) -> bool:
    """RFC 1123 label: one part of a subdomain (a namespace, a DRA device name)."""
    return len(text) <= MAX_LABEL and _LABEL.fullmatch(text) is not None


def is_node_name(text: str) -> bool:
    """Whether ``text`` may be a Kubernetes Node's name."""
    return is_dns_subdomain(text)


def node_name(flag: str, text: str) -> str:
    """``text`` as a node name, or :class:`ConfigError` naming ``flag``."""
    if not is_node_name(text):
        raise ConfigError(flag, f"not a valid Kubernetes node name: {text!r}")
    return text
