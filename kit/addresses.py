"""Network addresses as flags and files give them: ``host:port``, ports, listen hosts."""

from __future__ import annotations

import ipaddress
import re

from capwatch.kit.errors import ConfigError
from capwatch.kit.flags import is_digits
from capwatch.kit.names import is_dns_subdomain

_HOST_PORT = re.compile(r"(?P<host>\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.\-]*):(?P<port>[0-9]{1,5})")


def host_port(text: str) -> tuple[str, int] | None:
    """``host:port`` (host may be ``[v6]`` or empty) split, or None if it is not one."""
    match = _HOST_PORT.fullmatch(text)
    if match is None or int(match["port"]) > 65535:
        return None
    return match["host"], int(match["port"])


def listen_port(flag: str, text: str) -> int:
    """A TCP port from 1 to 65535."""
    if not is_digits(text) or not 1 <= int(text) <= 65535:
        raise ConfigError(flag, f"must be a port from 1 to 65535, got {text!r}")
    return int(text)


def listen_address(flag: str, text: str) -> str:
    """An IP address or host name to listen on (``[::]`` and ``::`` alike)."""
    host = text.removeprefix("[").removesuffix("]")  # "[::]" as well as "::"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not is_dns_subdomain(host.lower()):
            raise ConfigError(flag, f"expected an IP address or host name, got {text!r}") from None
    return host
