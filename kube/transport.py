"""HTTP to the API server: one urllib3 pool, the credentials, raw answers.

Every Kubernetes request capwatch makes, the agent's and the controller's, goes
through :class:`ApiTransport.request`: the path and query, a JSON (or apply)
body, the caller's timeout, and back the raw response with its body unread, so
a watch streams line by line and a list decodes only the fields its reader
keeps. The status is the caller's to read: an error answer is an answer.

urllib3's own retries are off (each caller owns its retry policy and deadline;
hidden retries would multiply a hanging request's duration), and TCP keepalive
is on with client-go's timings, so a watch through a proxy that silently drops
idle flows is noticed.
"""

from __future__ import annotations

import base64
import logging
import os
import socket
import ssl
import tempfile
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

import urllib3
import urllib3.connection
import urllib3.exceptions
import urllib3.util.ssl_

from capwatch.kit.clock import Clock, SystemClock
from capwatch.kit.errors import ConfigError
from capwatch.kube.access import TOKEN_REREAD_S, ClusterAccess

log = logging.getLogger(__name__)

# client-go's dialer: keepalive probes after 30 s idle, every 30 s (Linux's names).
_KEEPALIVE = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
if hasattr(socket, "TCP_KEEPIDLE"):
    _KEEPALIVE += [(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 30)]
    _KEEPALIVE += [(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 30)]

Timeout = float | tuple[float, float]  # total; or (connect, read)


# Connections kept open for reuse. A request beyond them still goes out, on a
# connection dropped after it: users with more in flight at once size it so.
DEFAULT_CONNECTIONS = 16


class ApiTransport:
    """Requests to one API server as one identity (thread-safe; urllib3 pools connections)."""

    def __init__(
        self,
        access: ClusterAccess,
        *,
        user_agent: str,
        maxsize: int = DEFAULT_CONNECTIONS,
        clock: Clock | None = None,
    ) -> None:
        self._server = access.server
        self._access = access
        self._agent = user_agent
        self._token = access.token
        self._token_read = -TOKEN_REREAD_S
        self._clock: Clock = clock or SystemClock()
        self._lock = threading.Lock()
        options: dict[str, Any] = {
            "retries": False,
            "maxsize": maxsize,
            "socket_options": urllib3.connection.HTTPConnection.default_socket_options + _KEEPALIVE,
        }
        if access.server.startswith("https://"):
            options.update(_tls_options(access))
        if access.insecure:
            # Said once here rather than by urllib3 at every request of a long-lived agent.
            log.warning("TLS verification of %s is off, as %s says", access.server, access.source)
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        self._pool = urllib3.PoolManager(**options)

    @property
    def server(self) -> str:
        return self._server

    def use_pool_classes(
        self, *, http: type[urllib3.HTTPConnectionPool], https: type[urllib3.HTTPSConnectionPool]
    ) -> None:
        """Connection pools of these classes from now on (the controller's check each send)."""
        self._pool.pool_classes_by_scheme = {"http": http, "https": https}

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: bytes | None = None,
        content_type: str = "application/json",
        timeout: Timeout,
    ) -> urllib3.HTTPResponse:
        """``method path?query`` with ``body``; the response unread, whatever its status.

        Transport failures raise urllib3's errors or OSError, as urllib3 does."""
        url = self._server + path + (f"?{urlencode(query)}" if query else "")
        headers = {"Accept": "application/json", "User-Agent": self._agent}
        if body is not None:
            headers["Content-Type"] = content_type
        authorization = self._authorization()
        if authorization:
            headers["Authorization"] = authorization
        limit = (
            urllib3.Timeout(connect=timeout[0], read=timeout[1])
            if isinstance(timeout, tuple)
            else urllib3.Timeout(total=timeout)
        )
        response = self._pool.request(
            method, url, body=body, headers=headers, timeout=limit, preload_content=False
        )
        assert isinstance(response, urllib3.HTTPResponse)  # urllib3's own, never an emscripten one
        return response

    def close(self) -> None:
        self._pool.clear()

    def _authorization(self) -> str | None:
        access = self._access
        if access.token_file:
            with self._lock:
                now = self._clock.monotonic()
                if now - self._token_read >= TOKEN_REREAD_S:
                    try:
                        with open(access.token_file, encoding="utf-8") as file:
                            self._token = file.read().strip()
                        self._token_read = now
                    except OSError:
                        pass  # keep the last token; the server's 401 will say if it expired
        if self._token:
            return f"Bearer {self._token}"
        if access.basic_auth:
            return "Basic " + base64.b64encode(access.basic_auth.encode()).decode()
        return None


def _tls_options(access: ClusterAccess) -> dict[str, Any]:
    """urllib3's TLS settings for ``access``: what to trust, which name, which client cert."""
    cert_reqs = ssl.CERT_NONE if access.insecure else ssl.CERT_REQUIRED
    context = urllib3.util.ssl_.create_urllib3_context(cert_reqs=cert_reqs)
    try:
        if access.insecure:
            pass
        elif access.ca_pem is not None:
            context.load_verify_locations(cadata=access.ca_pem.decode("ascii"))
        else:
            context.load_default_certs()
        if access.client_cert_pem is not None or access.client_key_pem is not None:
            _load_client_cert(context, access)
    except (ssl.SSLError, ValueError, OSError) as err:
        raise ConfigError(
            "--kubeconfig" if access.source != "in-cluster" else "in-cluster",
            f"cannot use the TLS material of {access.source or access.server}: {err}",
        ) from err
    options: dict[str, Any] = {"ssl_context": context, "cert_reqs": cert_reqs}
    if access.insecure:
        options["assert_hostname"] = False
    elif access.tls_server_name:
        options["server_hostname"] = access.tls_server_name
        options["assert_hostname"] = access.tls_server_name
    return options


def _load_client_cert(context: ssl.SSLContext, access: ClusterAccess) -> None:
    """The client certificate into ``context``: ssl loads a chain only from files, so the
    PEM goes through a private temporary directory that is gone when this returns."""
    if access.client_cert_pem is None or access.client_key_pem is None:
        raise ValueError("a client certificate needs both its certificate and its key")
    with tempfile.TemporaryDirectory(prefix="capwatch-tls-") as folder:
        cert = os.path.join(folder, "cert.pem")
        key = os.path.join(folder, "key.pem")
        for path, data in ((cert, access.client_cert_pem), (key, access.client_key_pem)):
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as file:
                file.write(data)
        context.load_cert_chain(cert, key)
