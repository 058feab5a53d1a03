"""TLS credentials for the TCP listeners, kept current with their files.

Certificates are renewed in place: cert-manager rewrites the Secret and the
kubelet swaps the mounted files atomically. gRPC asks for the certificate
configuration before every new TLS handshake, so the agent re-reads the
files when they have changed, and serves the renewed pair without a restart.
Connections already open keep the session they negotiated.

A renewal that cannot be used (a half-written or mismatched pair, a file that
is missing or unreadable, a client CA that is not PEM) is logged once and the
pair in service stays in service: clients keep being served until the files
are fixed. At start-up the same checks fail the start instead.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc

from capwatch.kit.errors import CapwatchError
from capwatch.kit.tls import TlsFileError, check_ca, check_pair
from capwatch.server.settings import TlsFiles

log = logging.getLogger(__name__)

# Per file: (device, inode, size, modification time). The kubelet's swap gives
# every file a new inode, so a renewal is seen even within one second.
Signature = tuple[tuple[int, int, int, int], ...]


_READ_ATTEMPTS = 3


class CertificateError(CapwatchError):
    """A certificate, key or client CA file cannot be used."""


@dataclass(frozen=True, kw_only=True)
class Reloads:
    """Renewals taken up, and bad states of the files refused (each counted once)."""

    loaded: int
    rejected: int


@dataclass(frozen=True, kw_only=True)
class _Pair:
    signature: Signature
    configuration: grpc.ServerCertificateConfiguration


class ReloadingCertificates:
    """Server credentials whose certificate follows the files in ``tls``."""

    def __init__(self, tls: TlsFiles) -> None:
        self._tls = tls
        self._paths = tuple(p for p in (tls.cert, tls.key, tls.client_ca) if p is not None)
        self._lock = threading.Lock()  # the fetcher runs on grpc's own threads
        first = self._load()  # raises CertificateError: the start fails
        self._initial = first.configuration
        self._serving = first.signature
        self._rejected: Signature | str | None = None  # the last bad state logged
        self._loaded_count = 0
        self._rejected_count = 0

    def reloads(self) -> Reloads:
        with self._lock:
            return Reloads(loaded=self._loaded_count, rejected=self._rejected_count)

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._initial,
            # grpc documents None as "keep the current configuration"; the type
            # stubs leave it out.
            self._fetch,  # type: ignore[arg-type]
            require_client_authentication=self._tls.client_ca is not None,
        )

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """Called by grpc before each handshake: a new configuration, or None to keep it."""
        try:
            signature = self._signature()
        except OSError as exc:  # e.g. the Secret was deleted: its links dangle
            self._reject(str(exc), f"cannot read the TLS files: {exc}")
            return None
        with self._lock:
            if signature in (self._serving, self._rejected):
                return None
        try:
            pair = self._load()
        except CertificateError as exc:
            self._reject(signature, str(exc))
            return None
        with self._lock:
            self._serving, self._rejected = pair.signature, None
            self._loaded_count += 1
        log.info("grpc TLS certificate reloaded from %s", self._tls.cert)
        return pair.configuration

    def _reject(self, state: Signature | str, why: str) -> None:
        with self._lock:
            if state == self._rejected:
                return  # said (and counted) once per bad state, not once per connection
            self._rejected = state
            self._rejected_count += 1
        log.error("%s; still serving the certificate loaded before", why)

    def _signature(self) -> Signature:
        stats = (os.stat(path) for path in self._paths)
        return tuple((s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns) for s in stats)

    def _load(self) -> _Pair:
        """Read and check the files; what grpc gets is what was checked.

        Files that change while being read (an update under way) are read
        again: a few times, then it is an error like any other.
        """
        tls = self._tls
        for _ in range(_READ_ATTEMPTS):
            try:
                before = self._signature()
                cert, key = tls.cert.read_bytes(), tls.key.read_bytes()
                client_ca = tls.client_ca.read_bytes() if tls.client_ca else None
                _check(tls.cert, tls.key, client_ca)
                if self._signature() != before:
                    continue
            except OSError as exc:
                raise CertificateError(f"cannot read the TLS files: {exc}") from exc
            return _Pair(
                signature=before,
                configuration=grpc.ssl_server_certificate_configuration(
                    [(key, cert)], root_certificates=client_ca
                ),
            )
        raise CertificateError(
            f"the TLS files kept changing while being read {_READ_ATTEMPTS} times"
        )


def _check(cert: Path, key: Path, client_ca: bytes | None) -> None:
    """What grpc would only find out at the next handshake, found out now (the checks
    the settings made at start, kit/tls.py's)."""
    try:
        check_pair(cert, key)
    except TlsFileError as exc:
        raise CertificateError(
            f"{cert} and {key} are not a PEM certificate chain and its private key: {exc}"
        ) from exc
    if client_ca is None:
        return
    try:
        check_ca(client_ca)
    except TlsFileError as exc:
        raise CertificateError(f"the client CA file is {exc}") from exc
