"""Loopback ports for the control plane: found free, or checked free when given."""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass

from tests.realkube.flags import LOOPBACK


class PortError(Exception):
    """A port given is taken, or given twice."""


@dataclass(frozen=True)
class Ports:
    """The loopback ports etcd and the API server listen on."""

    etcd_client: int
    etcd_peer: int
    apiserver: int

    @classmethod
    def free(cls, apiserver: int | None = None, etcd_client: int | None = None) -> Ports:
        """Free ports for whatever is not given; a given port must be free now."""
        if apiserver is not None and apiserver == etcd_client:
            raise PortError(f"port {apiserver} given for both etcd and kube-apiserver")
        for port in (apiserver, etcd_client):
            if port is not None and not port_free(port):
                raise PortError(f"port {port} on {LOOPBACK} is already in use")
        spare = iter(free_ports(3))
        return cls(
            etcd_client=etcd_client or next(spare),
            etcd_peer=next(spare),
            apiserver=apiserver or next(spare),
        )


def free_ports(count: int) -> list[int]:
    """count distinct ports free on 127.0.0.1 just now (the kernel picks each for port 0).

    All are held open together while picked, so no two are the same; another
    process may still take one before our server binds it (as with envtest).
    """
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind((LOOPBACK, 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def free_port() -> int:
    """A port free on 127.0.0.1 just now."""
    return free_ports(1)[0]


def port_free(port: int) -> bool:
    """Whether a server could listen on port on 127.0.0.1 now.

    With SO_REUSEADDR, as Go's listeners (etcd's, kube-apiserver's) set it: a port
    whose old connections linger in TIME_WAIT is free to them, one with a listener is not.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
        return True
