"""TLS and mutual TLS on TCP listeners; the unix socket stays plaintext.

Certificates are made at test time with the openssl command (EC P-256, one
day): a CA, a server certificate for 127.0.0.1 and localhost, a client
certificate it signed, and a second CA with a client certificate of its own.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.api.gen.capwatch.v1 import node_health_pb2_grpc as pb_grpc
from capwatch.server import certificates
from capwatch.server.certificates import Reloads
from capwatch.server.listeners import ServeError
from capwatch.server.settings import TlsFiles
from tests.server.harness import NODE, ServerHarness, running, settings_for

pytestmark = pytest.mark.asyncio

EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


@dataclass(frozen=True, kw_only=True)
class Pki:
    directory: Path

    def read(self, name: str) -> bytes:
        return (self.directory / name).read_bytes()

    def path(self, name: str) -> str:
        return str(self.directory / name)


def _openssl(directory: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=30)


def _ca(directory: Path, name: str) -> None:
    _openssl(
        directory, "req", "-x509", *EC, "-days", "1", "-subj", f"/CN={name}",
        "-keyout", f"{name}.key", "-out", f"{name}.pem",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip


def _leaf(directory: Path, name: str, ca: str, extensions: str) -> None:
    _openssl(
        directory, "req", "-new", *EC, "-subj", f"/CN={name}",
        "-keyout", f"{name}.key", "-out", f"{name}.csr",
    )  # fmt: skip
    (directory / f"{name}.ext").write_text(extensions)
    _openssl(
        directory, "x509", "-req", "-in", f"{name}.csr", "-days", "1",
        "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
        "-extfile", f"{name}.ext", "-out", f"{name}.pem",
    )  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA with server and client certificates, and a rogue CA with its own client."""
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is needed to make the test certificates")
    directory = tmp_path_factory.mktemp("pki")
    _ca(directory, "ca")
    _ca(directory, "rogue-ca")
    _leaf(
        directory,
        "server",
        "ca",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    _leaf(directory, "client", "ca", "extendedKeyUsage=clientAuth\n")
    _leaf(directory, "rogue-client", "rogue-ca", "extendedKeyUsage=clientAuth\n")
    # A renewal from another issuer: clients can tell which one is served.
    _leaf(
        directory,
        "renewed",
        "rogue-ca",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    _openssl(
        directory, "pkey", "-in", "server.key", "-aes256", "-passout", "pass:secret",
        "-out", "encrypted.key",
    )  # fmt: skip
    return Pki(directory=directory)


def secure(target: str, pki: Pki, client: str | None = None, trust: str = "ca") -> grpc.aio.Channel:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=pki.read(f"{trust}.pem"),
        private_key=pki.read(f"{client}.key") if client else None,
        certificate_chain=pki.read(f"{client}.pem") if client else None,
    )
    return grpc.aio.secure_channel(target, credentials)


async def snapshot(channel: grpc.aio.Channel) -> pb.NodeSnapshot:
    response = await pb_grpc.NodeHealthServiceStub(channel).GetSnapshot(
        pb.GetSnapshotRequest(), timeout=5
    )
    return response.snapshot


async def refused(channel: grpc.aio.Channel) -> grpc.StatusCode:
    async with channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await snapshot(channel)
    return caught.value.code()


@pytest_asyncio.fixture
async def tls_server(pki: Pki, tmp_path: Path) -> AsyncIterator[ServerHarness]:
    settings = settings_for(
        f"unix://{tmp_path / 'agent.sock'}",
        "127.0.0.1:0",
        extra={"grpc_tls_cert": pki.path("server.pem"), "grpc_tls_key": pki.path("server.key")},
    )
    async with running(settings=settings) as harness:
        yield harness


@pytest_asyncio.fixture
async def mtls_server(pki: Pki, tmp_path: Path) -> AsyncIterator[ServerHarness]:
    settings = settings_for(
        f"unix://{tmp_path / 'agent.sock'}",
        "127.0.0.1:0",
        extra={
            "grpc_tls_cert": pki.path("server.pem"),
            "grpc_tls_key": pki.path("server.key"),
            "grpc_tls_client_ca": pki.path("ca.pem"),
        },
    )
    async with running(settings=settings) as harness:
        yield harness


async def test_tls_client_trusting_the_ca_is_served(tls_server: ServerHarness, pki: Pki) -> None:
    """A TLS client with the CA reaches the service over 127.0.0.1, and by name (localhost)."""
    port = tls_server.target.rsplit(":", 1)[1]
    for target in (tls_server.target, f"localhost:{port}"):
        async with secure(target, pki) as channel:
            assert (await snapshot(channel)).node_name == NODE


async def test_plaintext_client_cannot_talk_to_a_tls_listener(
    tls_server: ServerHarness,
) -> None:
    """A plaintext client gets UNAVAILABLE from the TLS listener (no downgrade)."""
    assert await refused(grpc.aio.insecure_channel(tls_server.target)) == (
        grpc.StatusCode.UNAVAILABLE
    )


async def test_plaintext_servers_report_no_certificate_reloads(tmp_path: Path) -> None:
    """Without TLS there is nothing to reload: None, so metrics leave the series out."""
    async with running(settings=settings_for("127.0.0.1:0")) as harness:
        assert harness.server.certificate_reloads() is None


async def test_unix_socket_stays_plaintext_under_tls(tls_server: ServerHarness) -> None:
    """TLS applies to TCP listeners only: the local socket serves plaintext (modes guard it)."""
    unix = next(a for a in tls_server.server.addresses if a.startswith("unix:"))
    async with grpc.aio.insecure_channel(unix) as channel:
        assert (await snapshot(channel)).node_name == NODE


async def test_mutual_tls_serves_a_client_with_a_good_certificate(
    mtls_server: ServerHarness, pki: Pki
) -> None:
    """With --grpc-tls-client-ca, a client presenting a certificate the CA signed is served."""
    async with secure(mtls_server.target, pki, client="client") as channel:
        assert (await snapshot(channel)).node_name == NODE


@pytest.mark.parametrize("client", [None, "rogue-client"], ids=["no-cert", "other-ca"])
async def test_mutual_tls_refuses_other_clients(
    mtls_server: ServerHarness, pki: Pki, client: str | None
) -> None:
    """No client certificate, or one signed by another CA: the handshake fails (UNAVAILABLE)."""
    assert await refused(secure(mtls_server.target, pki, client=client)) == (
        grpc.StatusCode.UNAVAILABLE
    )


async def test_mutual_tls_keeps_the_unix_socket_plaintext(mtls_server: ServerHarness) -> None:
    """Mutual TLS does not reach the local socket either: the shim needs no client certificate."""
    unix = next(a for a in mtls_server.server.addresses if a.startswith("unix:"))
    async with grpc.aio.insecure_channel(unix) as channel:
        assert (await snapshot(channel)).node_name == NODE


class MountedSecret:
    """A directory laid out as the kubelet mounts a Secret, updated as it updates one.

    ``tls.crt`` and ``tls.key`` are links through ``..data``, a link to a
    timestamped directory; an update writes a new directory and swaps ``..data``
    in one rename.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.versions = 0
        for name in ("tls.crt", "tls.key"):
            (directory / name).symlink_to(f"..data/{name}")

    def write(self, cert: bytes, key: bytes) -> None:
        self.versions += 1
        version = self.directory / f"..v{self.versions}"
        version.mkdir()
        (version / "tls.crt").write_bytes(cert)
        (version / "tls.key").write_bytes(key)
        (self.directory / "..data_tmp").symlink_to(version.name)
        os.replace(self.directory / "..data_tmp", self.directory / "..data")

    def settings(self) -> dict[str, object]:
        return {
            "grpc_tls_cert": str(self.directory / "tls.crt"),
            "grpc_tls_key": str(self.directory / "tls.key"),
        }


@pytest_asyncio.fixture
async def secret_server(
    pki: Pki, tmp_path: Path
) -> AsyncIterator[tuple[ServerHarness, MountedSecret]]:
    (tmp_path / "secret").mkdir()
    secret = MountedSecret(tmp_path / "secret")
    secret.write(pki.read("server.pem"), pki.read("server.key"))
    settings = settings_for("127.0.0.1:0", extra=secret.settings())
    async with running(settings=settings) as harness:
        yield harness, secret


def certificate_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "capwatch.server.certificates"]


async def served_by(target: str, pki: Pki) -> str:
    """Which issuer's certificate the listener presents to a new connection."""
    for trust in ("ca", "rogue-ca"):
        async with secure(target, pki, trust=trust) as channel:
            try:
                await snapshot(channel)
            except grpc.aio.AioRpcError:
                continue
            return trust
    raise AssertionError("neither issuer's clients were served")


async def test_a_renewed_certificate_is_served_without_a_restart(
    secret_server: tuple[ServerHarness, MountedSecret], pki: Pki
) -> None:
    """A Secret update (the kubelet's swap) is served to new connections; open ones go on."""
    harness, secret = secret_server
    assert await served_by(harness.target, pki) == "ca"
    assert harness.server.certificate_reloads() == Reloads(loaded=0, rejected=0)
    async with secure(harness.target, pki) as opened:
        await snapshot(opened)
        secret.write(pki.read("renewed.pem"), pki.read("renewed.key"))
        assert await served_by(harness.target, pki) == "rogue-ca"
        assert (await snapshot(opened)).node_name == NODE  # its session stands
    assert harness.server.certificate_reloads() == Reloads(loaded=1, rejected=0)


@pytest.mark.parametrize(
    ("cert", "key", "why"),
    [
        ("renewed.pem", "server.key", "not a PEM certificate chain and its private key"),
        ("renewed.pem", "encrypted.key", "tls.key is encrypted"),
        ("server.csr", "server.key", "not a PEM certificate chain"),
    ],
    ids=["mismatched", "encrypted-key", "not-a-certificate"],
)
async def test_an_unusable_renewal_leaves_the_certificate_in_service(
    secret_server: tuple[ServerHarness, MountedSecret],
    pki: Pki,
    caplog: pytest.LogCaptureFixture,
    cert: str,
    key: str,
    why: str,
) -> None:
    """A bad update is logged once and the previous pair goes on serving; a fix is taken up."""
    harness, secret = secret_server
    secret.write(pki.read(cert), pki.read(key))
    with caplog.at_level(logging.ERROR, logger="capwatch.server.certificates"):
        for _ in range(3):  # three new connections, one log line
            assert await served_by(harness.target, pki) == "ca"
    errors = certificate_errors(caplog)
    assert len(errors) == 1, errors
    assert why in errors[0]
    assert "still serving" in errors[0]
    assert harness.server.certificate_reloads() == Reloads(loaded=0, rejected=1)
    secret.write(pki.read("renewed.pem"), pki.read("renewed.key"))
    assert await served_by(harness.target, pki) == "rogue-ca"
    assert harness.server.certificate_reloads() == Reloads(loaded=1, rejected=1)


async def test_files_changing_while_read_are_read_again_not_refused(
    secret_server: tuple[ServerHarness, MountedSecret],
    pki: Pki,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An update landing between reading the files and checking them is no rejection:
    the files are read again and the newest pair is served."""
    harness, secret = secret_server
    real_check = certificates._check
    swaps = [("renewed.pem", "renewed.key")]

    def check_while_updating(*args: object) -> None:
        real_check(*args)  # type: ignore[arg-type]
        if swaps:
            cert, key = swaps.pop()
            secret.write(pki.read(cert), pki.read(key))

    monkeypatch.setattr(certificates, "_check", check_while_updating)
    secret.write(pki.read("server.pem"), pki.read("server.key"))  # a new version to load
    assert await served_by(harness.target, pki) == "rogue-ca"
    assert harness.server.certificate_reloads() == Reloads(loaded=1, rejected=0)


async def test_a_deleted_secret_leaves_the_certificate_in_service(
    secret_server: tuple[ServerHarness, MountedSecret],
    pki: Pki,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Files gone (links dangling) are logged once; the loaded pair goes on serving."""
    harness, secret = secret_server
    (secret.directory / "..data").unlink()
    with caplog.at_level(logging.ERROR, logger="capwatch.server.certificates"):
        for _ in range(3):
            assert await served_by(harness.target, pki) == "ca"
    errors = certificate_errors(caplog)
    assert len(errors) == 1, errors
    assert "cannot read the TLS files" in errors[0]


@pytest.mark.parametrize(
    ("cert", "key", "client_ca", "why"),
    [
        ("server.pem", "client.key", None, "not a PEM certificate chain and its private key"),
        ("server.pem", "encrypted.key", None, "encrypted.key is encrypted"),
        ("server.pem", "server.key", "server.key", "client CA file is not PEM certificates"),
    ],
    ids=["mismatched", "encrypted-key", "client-ca-not-a-certificate"],
)
async def test_unusable_tls_files_fail_the_start(
    pki: Pki, cert: str, key: str, client_ca: str | None, why: str
) -> None:
    """At start-up the checks that keep a bad renewal out fail the start, naming the files
    (the settings refuse such files first, tests/test_tls_files.py; these are files that
    went bad after that)."""
    settings = replace(
        settings_for("127.0.0.1:0"),
        tls=TlsFiles(
            cert=Path(pki.path(cert)),
            key=Path(pki.path(key)),
            client_ca=Path(pki.path(client_ca)) if client_ca else None,
        ),
    )
    harness = None
    with pytest.raises(ServeError, match=rf"cannot listen on 127\.0\.0\.1:0: .*{why}"):
        async with running(settings=settings) as harness:
            pass
    assert harness is None
