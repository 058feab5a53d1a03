"""TLS files checked the way gRPC will use them: PEM certificates, and a key that fits.

Every command that takes TLS files (the agent's ``--grpc-tls-*``, the
controller's ``--agent-tls-*``, ...) checks them here before anything starts,
so a directory, a DER file or a key that belongs to another certificate is
one line naming the flag, not a traceback or a peer that never verifies.
The standard library's ``ssl`` (OpenSSL) reads them: gRPC's own TLS reads
the same PEM blocks, and it is not loaded until the first connection.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from capwatch.kit.errors import CapwatchError, ConfigError

# What a certificate and a private key look like in PEM (RFC 7468's labels).
_CERTIFICATE = re.compile(rb"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", re.S)
_PRIVATE_KEY = re.compile(rb"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----")
_SOURCE_LINE = re.compile(r"\s*\(_ssl\.c:\d+\)$")


class TlsFileError(CapwatchError):
    """A TLS file that gRPC could not use; ``path`` is the file at fault."""

    def __init__(self, path: Path | None, reason: str) -> None:
        super().__init__(reason)
        self.path = path


def check_ca(data: bytes) -> None:
    """``data`` holds at least one PEM certificate, and every one of them loads.

    Raises TlsFileError("not PEM certificates: ...").
    """
    blocks = _CERTIFICATE.findall(data)
    if not blocks:
        raise TlsFileError(None, "not PEM certificates: no -----BEGIN CERTIFICATE----- block")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        # The blocks alone: comments around them may be in any encoding.
        context.load_verify_locations(cadata=b"\n".join(blocks).decode("ascii"))
    except (ssl.SSLError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise TlsFileError(None, f"not PEM certificates: {_reason(exc)}") from exc


def check_pair(cert: Path, key: Path) -> None:
    """``cert`` is a PEM certificate chain and ``key`` its unencrypted private key.

    Raises TlsFileError naming the file at fault; OSError if one cannot be read.
    """
    if not _CERTIFICATE.search(cert.read_bytes()):
        raise TlsFileError(cert, f"{cert} holds no PEM certificate")
    if not _PRIVATE_KEY.search(key.read_bytes()):
        raise TlsFileError(key, f"{key} holds no PEM private key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)

    def no_password() -> bytes:  # an encrypted key is an error, not a prompt on the terminal
        raise TlsFileError(key, f"{key} is encrypted (keys are read without a passphrase)")

    try:
        context.load_cert_chain(cert, key, password=no_password)
    except ssl.SSLError as exc:
        if getattr(exc, "reason", None) == "KEY_VALUES_MISMATCH":
            raise TlsFileError(key, f"{key} is not the private key of {cert}") from exc
        raise TlsFileError(cert, f"{cert} and {key} cannot be loaded: {_reason(exc)}") from exc
    except ValueError as exc:
        raise TlsFileError(cert, f"{cert} and {key} cannot be loaded: {exc}") from exc


def ca_flag(flag: str, path: Path) -> None:
    """The CA file a flag names is PEM certificates. Raises ConfigError naming ``flag``."""
    with _flagged({path: flag}):
        data = _read(path)
        try:
            check_ca(data)
        except TlsFileError as exc:
            raise TlsFileError(path, f"{path} is {exc}") from exc


def pair_flags(cert_flag: str, cert: Path, key_flag: str, key: Path) -> None:
    """The certificate and key two flags name go together. Raises ConfigError naming the
    flag whose file is at fault."""
    with _flagged({cert: cert_flag, key: key_flag}):
        _read(cert)
        _read(key)
        check_pair(cert, key)


@contextmanager
def _flagged(flags: dict[Path, str]) -> Iterator[None]:
    """TlsFileError and OSError raised inside, as ConfigError naming the file's flag."""
    first = next(iter(flags.values()))
    try:
        yield
    except TlsFileError as exc:
        raise ConfigError(flags.get(exc.path, first) if exc.path else first, str(exc)) from exc
    except OSError as exc:
        if not exc.filename:
            raise ConfigError(first, f"cannot read the file: {exc.strerror}") from exc
        path = Path(exc.filename)
        raise ConfigError(flags.get(path, first), f"cannot read {path}: {exc.strerror}") from exc


def _read(path: Path) -> bytes:
    """The file's bytes; a directory or a device is not a TLS file (TlsFileError)."""
    if not path.is_file():
        raise TlsFileError(path, f"{path} is not a readable file")
    return path.read_bytes()


def _reason(exc: Exception) -> str:
    """OpenSSL's reason without CPython's source line: ``[X509: ...] no certificate``."""
    text = exc.args[1] if isinstance(exc, ssl.SSLError) and len(exc.args) > 1 else str(exc)
    return _SOURCE_LINE.sub("", str(text))
