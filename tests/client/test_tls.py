"""The client and ``capwatch watch`` over (mutual) TLS, with throwaway certificates."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from capwatch.cli import main
from capwatch.client.node_health import Disconnected, NodeHealthClient, Snapshot
from tests.server.harness import ServerHarness, settings_for, start_harness

pytestmark = pytest.mark.asyncio

SERVER_NAME = "agent.test"


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=10)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    """A CA, a server certificate for agent.test and a client certificate, all P-256."""
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is needed to make test certificates (.ci/run installs it)")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
             "-subj", "/CN=test-ca", cwd=tmp_path)  # fmt: skip
    (tmp_path / "san.ext").write_text(f"subjectAltName=DNS:{SERVER_NAME}\n")
    for name, extra in (("server", ("-extfile", "san.ext")), ("client", ())):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=tmp_path)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.pem", "-days", "1", *extra,
                 cwd=tmp_path)  # fmt: skip
    return Pki(
        ca=tmp_path / "ca.pem",
        server_cert=tmp_path / "server.pem",
        server_key=tmp_path / "server.key",
        client_cert=tmp_path / "client.pem",
        client_key=tmp_path / "client.key",
    )


@pytest_asyncio.fixture
async def mtls_harness(pki: Pki, servers: list[ServerHarness]) -> ServerHarness:
    """An agent server that requires a client certificate signed by the test CA."""
    settings = settings_for(
        "127.0.0.1:0",
        extra={
            "grpc_tls_cert": str(pki.server_cert),
            "grpc_tls_key": str(pki.server_key),
            "grpc_tls_client_ca": str(pki.ca),
        },
    )
    started = await start_harness(settings=settings)
    servers.append(started)
    return started


async def test_client_streams_over_mutual_tls(mtls_harness: ServerHarness, pki: Pki):
    """With the CA, a client certificate and the server name, the stream and GetSnapshot work."""
    mtls_harness.publish()
    async with NodeHealthClient(
        target=mtls_harness.target,
        root_certificates=pki.ca.read_bytes(),
        certificate_chain=pki.client_cert.read_bytes(),
        private_key=pki.client_key.read_bytes(),
        options=[("grpc.ssl_target_name_override", SERVER_NAME)],
    ) as client:
        assert (await client.snapshot()).sequence == 1
        events = client.events()
        first = await anext(events)
        assert isinstance(first, Snapshot)
        await events.aclose()


async def test_client_without_certificate_is_refused(mtls_harness: ServerHarness, pki: Pki):
    """Mutual TLS: no client certificate, no stream (UNAVAILABLE, retried with backoff)."""
    async with NodeHealthClient(
        target=mtls_harness.target,
        root_certificates=pki.ca.read_bytes(),
        options=[("grpc.ssl_target_name_override", SERVER_NAME)],
    ) as client:
        events = client.events()
        async with asyncio.timeout(3):
            lost = await anext(events)
        assert isinstance(lost, Disconnected)
        assert lost.code is grpc.StatusCode.UNAVAILABLE
        await events.aclose()


async def test_watch_tls_flags(mtls_harness: ServerHarness, pki: Pki, capsys):
    """capwatch watch --tls-ca/--tls-cert/--tls-key/--tls-server-name reaches a mutual-TLS agent."""
    argv = [
        "watch",
        "--target",
        mtls_harness.target,
        "--tls-ca",
        str(pki.ca),
        "--tls-cert",
        str(pki.client_cert),
        "--tls-key",
        str(pki.client_key),
        "--tls-server-name",
        SERVER_NAME,
        "--json",
        "--count",
        "1",
    ]
    async with asyncio.timeout(5):
        assert await asyncio.to_thread(main, argv, {}) == 0
    assert capsys.readouterr().out.startswith('{"snapshot": ')


@pytest.mark.parametrize("bad", ["directory", "not-pem", "key-of-another"])
async def test_watch_refuses_unusable_tls_files_up_front(
    tmp_path: Path, pki: Pki, capsys, bad: str
):
    """A directory or a file that is not PEM as --tls-ca, or a key that is not the
    certificate's, is one line naming the flag and exit 2 before anything is dialled (it
    used to pass, and every connection then failed as "cannot reach")."""
    ca, key = pki.ca, pki.client_key
    flag = "--tls-ca"
    if bad == "directory":
        ca = tmp_path
    elif bad == "not-pem":
        ca = tmp_path / "ca.der"
        ca.write_bytes(b"\x30\x82\x01\x0a not a certificate")
    else:
        key, flag = pki.server_key, "--tls-key"
    argv = ["watch", "--target", "127.0.0.1:1", "--tls-ca", str(ca)]
    argv += ["--tls-cert", str(pki.client_cert), "--tls-key", str(key)]
    assert await asyncio.to_thread(main, argv, {}) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert flag in err[0], err
