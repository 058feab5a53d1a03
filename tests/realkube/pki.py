"""Certificates and keys for a loopback control plane, made with ``cryptography``.

One CA signs everything: the serving certificate (kube-apiserver, and the
secure ports of kube-controller-manager and kube-scheduler, all on 127.0.0.1),
the admin client certificate (CN admin, O system:masters), and client
certificates for the other components. The service-account signing key is a
separate key pair, as kube-apiserver's --service-account-signing-key-file and
--service-account-key-file want. ECDSA P-256 throughout: key generation is
instant, where RSA-2048 costs tens of milliseconds per key.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = timedelta(days=365)
# Backdated so that a clock a little behind (another host, a VM) still accepts it.
BACKDATE = timedelta(hours=1)
SERVING_DNS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
# 10.0.0.1: the `kubernetes` Service's ClusterIP in --service-cluster-ip-range
# 10.0.0.0/24. Only a name in the certificate; nothing connects to it.
SERVING_IPS = ("127.0.0.1", "10.0.0.1")


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate and its PEM private key on disk."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    """Every certificate and key the control plane uses, under one directory."""

    directory: Path
    ca: KeyPair
    serving: KeyPair
    admin: KeyPair
    service_account_key: Path
    service_account_pub: Path

    @classmethod
    def at(cls, directory: Path) -> Pki:
        """The file layout under directory (the files may not exist yet)."""
        return cls(
            directory=directory,
            ca=_pair(directory, "ca"),
            serving=_pair(directory, "serving"),
            admin=_pair(directory, "admin"),
            service_account_key=directory / "sa.key",
            service_account_pub=directory / "sa.pub",
        )

    @classmethod
    def create(cls, directory: Path) -> Pki:
        """A fresh CA, serving and admin certificates, and service-account key pair."""
        directory.mkdir(parents=True, exist_ok=True)
        pki = cls.at(directory)
        _make_ca(pki.ca)
        _issue(pki.ca, pki.serving, _name("kube-apiserver"), server=True)
        _issue(pki.ca, pki.admin, _name("admin", ("system:masters",)), server=False)
        signer = _new_key()
        _write_private(pki.service_account_key, signer)
        pki.service_account_pub.write_bytes(
            signer.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        return pki

    def issue_client(self, stem: str, user: str, groups: tuple[str, ...] = ()) -> KeyPair:
        """A client certificate for user (CN) in groups (O), as stem.crt/stem.key."""
        pair = _pair(self.directory, stem)
        _issue(self.ca, pair, _name(user, groups), server=False)
        return pair


def _pair(directory: Path, stem: str) -> KeyPair:
    return KeyPair(cert=directory / f"{stem}.crt", key=directory / f"{stem}.key")


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    # Kubernetes reads the user from CN and the groups from every O.
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _write_private(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """Write a private key readable by its owner alone, with no moment of wider mode."""
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _builder(
    subject: x509.Name, issuer: x509.Name, public: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.now(UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + VALIDITY)
    )


def _make_ca(pair: KeyPair) -> None:
    key = _new_key()
    name = _name("capwatch-realkube-ca")
    cert = (
        _builder(name, name, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_private(pair.key, key)
    _write_cert(pair.cert, cert)


def _load_ca(pair: KeyPair) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
    key = serialization.load_pem_private_key(pair.key.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{pair.key} is not the ECDSA key this module writes")
    return cert, key


def _issue(ca: KeyPair, pair: KeyPair, subject: x509.Name, *, server: bool) -> None:
    ca_cert, ca_key = _load_ca(ca)
    key = _new_key()
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        _builder(subject, ca_cert.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if server:
        names: list[x509.GeneralName] = [x509.DNSName(dns) for dns in SERVING_DNS]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in SERVING_IPS]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    _write_private(pair.key, key)
    _write_cert(pair.cert, builder.sign(ca_key, hashes.SHA256()))
