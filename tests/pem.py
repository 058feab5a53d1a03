"""Real PEM files for the tests that only need TLS settings to validate (kit/tls.py loads
them): one self-signed ECDSA P-256 certificate and its key, made once per process with
``cryptography`` and copied wherever a test wants them."""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@functools.cache
def _self_signed() -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "capwatch-test")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return (
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def write_certificate(path: Path) -> Path:
    """A PEM certificate (also usable as a CA bundle) at ``path``."""
    path.write_bytes(_self_signed()[0])
    return path


def write_key(path: Path) -> Path:
    """The PEM private key of :func:`write_certificate`'s certificate at ``path``."""
    path.write_bytes(_self_signed()[1])
    path.chmod(0o600)
    return path
