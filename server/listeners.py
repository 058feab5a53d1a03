"""What every capwatch gRPC server is built with: core options, the bind check, its error.

The agent's server (:mod:`capwatch.server.grpc.serving`), a pool's and the controller's
cluster stream (:mod:`capwatch.controller.cluster.serving`) all bind through these, so
they share grpc core's limits and report a busy port the same way; the agent's
and the sim DRA driver's unix sockets are bound by :func:`bind_unix`.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

from capwatch.kit.addresses import host_port
from capwatch.kit.errors import CapwatchError

OPTIONS: Sequence[tuple[str, int]] = (
    # Requests are tiny; refuse anything big before it is buffered.
    ("grpc.max_receive_message_length", 64 * 1024),
    ("grpc.max_send_message_length", 16 * 1024 * 1024),
    # Notice dead subscribers (a node reboot, a cut link) and let clients ping.
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
    # grpc core queues at most 1000 (hard limit 3000) calls not yet matched to a
    # handler and fails the rest; a burst of thousands of new streams (every
    # controller reconnecting at once) must all succeed.
    ("grpc.server.max_pending_requests", 20_000),
    ("grpc.server.max_pending_requests_hard_limit", 40_000),
    # An address in use must fail the start, not be shared with another process.
    ("grpc.so_reuseport", 0),
)


class ServeError(CapwatchError):
    """A listener could not be set up (address in use, bad certificate, ...)."""


def address_in_use(address: str) -> str | None:
    """Why ``host:port`` cannot be bound now (its port in use), or None.

    Asked before grpc binds: grpc core writes its own failure to stderr as a raw
    log line before it raises, and the command line promises one line. Bound as
    grpc binds (SO_REUSEADDR, no SO_REUSEPORT), so a port in TIME_WAIT is free
    here as it is for grpc. Anything else is left for grpc to report.
    """
    parsed = host_port(address)
    if parsed is None or parsed[1] == 0:
        return None
    host = parsed[0].removeprefix("[").removesuffix("]") or None
    try:
        candidates = socket.getaddrinfo(
            host, parsed[1], type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError:
        return None
    for family, kind, proto, _, sockaddr in candidates:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return "address already in use"
    return None


def bind_unix(add_port: Callable[[str], int], path: Path, *, umask: int) -> None:
    """Bind a unix socket at ``path`` through ``add_port`` (a grpc server's
    ``add_insecure_port``), the socket created under ``umask`` so that
    no other user can connect in the moment before its mode could be changed. A socket
    left there by a process that did not exit cleanly is replaced; anything else there
    is refused. Raises ServeError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise ServeError(f"{path} exists and is not a socket; refusing to replace it")
        path.unlink()
    old = os.umask(umask)
    try:
        port = add_port(f"unix://{path}")
    except RuntimeError as exc:
        raise ServeError(f"cannot listen on unix://{path}: {exc}") from exc
    finally:
        os.umask(old)
    if port == 0 or not path.exists():
        raise ServeError(f"cannot listen on unix://{path}")
