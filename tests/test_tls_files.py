"""TLS files are loaded when the settings are made (kit/tls.py): a directory, a file that
is not PEM or a key of another certificate is one line naming the flag, exit 2, for the
controller's --agent-tls-* and the agent's --grpc-tls-*."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from capwatch.cli import main
from capwatch.controller.settings import add_controller_arguments, controller_settings
from capwatch.kit.errors import ConfigError
from capwatch.kit.tls import TlsFileError, check_ca, check_pair
from capwatch.server.settings import server_settings
from tests.pem import write_certificate, write_key

CAPWATCH = [sys.executable, "-m", "capwatch.cli"]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """A certificate and its key, another key, a directory, and files that are not PEM."""
    other = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    made = {
        "cert": write_certificate(tmp_path / "cert.pem"),
        "key": write_key(tmp_path / "key.pem"),
        "other-key": tmp_path / "other.key",
        "directory": tmp_path / "certs",
        "text": tmp_path / "notes.txt",
        "targets": tmp_path / "targets",
    }
    made["other-key"].write_bytes(other)
    made["directory"].mkdir()
    made["text"].write_text("not a certificate\n")
    made["targets"].write_text("gpu-1 127.0.0.1:50051\n")
    return made


def _controller(files: dict[str, Path], *flags: str) -> list[str]:
    return ["controller", "--dry-run", "--targets", str(files["targets"]), *flags]


def test_a_directory_as_the_agents_ca_is_one_line_exit_2(files: dict[str, Path]):
    """`controller --agent-tls-ca DIR`: one line naming the flag, exit 2 (not a traceback
    from reading the directory at start)."""
    done = subprocess.run(
        [*CAPWATCH, *_controller(files, "--agent-tls-ca", str(files["directory"]))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"capwatch controller: error: --agent-tls-ca: {files['directory']} is not a readable file\n"
    )


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            {"--agent-tls-ca": "text"},
            "--agent-tls-ca: {text} is not PEM certificates: no -----BEGIN CERTIFICATE----- block",
        ),
        (
            {"--agent-tls-ca": "key"},
            "--agent-tls-ca: {key} is not PEM certificates: no -----BEGIN CERTIFICATE----- block",
        ),
        (
            {"--agent-tls-ca": "cert", "--agent-tls-cert": "text", "--agent-tls-key": "key"},
            "--agent-tls-cert: {text} holds no PEM certificate",
        ),
        (
            {"--agent-tls-ca": "cert", "--agent-tls-cert": "cert", "--agent-tls-key": "text"},
            "--agent-tls-key: {text} holds no PEM private key",
        ),
        (
            {"--agent-tls-ca": "cert", "--agent-tls-cert": "cert", "--agent-tls-key": "other-key"},
            "--agent-tls-key: {other-key} is not the private key of {cert}",
        ),
    ],
    ids=["ca-text", "ca-a-key", "cert-text", "key-text", "key-of-another"],
)
def test_controller_tls_files_that_grpc_cannot_use_are_refused(
    files: dict[str, Path], flags: dict[str, str], expected: str, capsys
):
    """A CA that is not PEM certificates (every node would read AgentUnreachable later), a
    client certificate or key that is not PEM, a key of another certificate: exit 2, one
    line naming the flag at fault."""
    argv = [part for flag, name in flags.items() for part in (flag, str(files[name]))]
    assert main(_controller(files, *argv), {}) == 2
    err = capsys.readouterr().err
    for name, path in files.items():
        expected = expected.replace(f"{{{name}}}", str(path))
    assert err == f"capwatch controller: error: {expected}\n"


def test_controller_tls_files_that_load_are_taken(files: dict[str, Path]):
    """A PEM CA, and a certificate with its own key: taken as given."""
    parser = argparse.ArgumentParser()
    add_controller_arguments(parser)
    args = parser.parse_args(
        [
            *("--dry-run", "--targets", str(files["targets"])),
            *("--agent-tls-ca", str(files["cert"]), "--agent-tls-cert", str(files["cert"])),
            *("--agent-tls-key", str(files["key"])),
        ]
    )
    tls = controller_settings(args, {}).agent_tls
    assert tls is not None
    assert (tls.ca, tls.cert, tls.key) == (files["cert"], files["cert"], files["key"])


@pytest.mark.parametrize(
    ("names", "flag"),
    [
        (("text", "key", None), "--grpc-tls-cert"),
        (("cert", "text", None), "--grpc-tls-key"),
        (("cert", "other-key", None), "--grpc-tls-key"),
        (("cert", "key", "text"), "--grpc-tls-client-ca"),
        (("cert", "key", "directory"), "--grpc-tls-client-ca"),
    ],
    ids=["cert-text", "key-text", "key-of-another", "client-ca-text", "client-ca-directory"],
)
def test_agent_tls_files_are_checked_by_its_settings(
    files: dict[str, Path], names: tuple[str, str, str | None], flag: str
):
    """The agent's --grpc-tls-* go through the same checks when its settings are made
    (exit 2 at the command line), not first when the listener starts (exit 1)."""
    cert, key, client_ca = names
    values = {
        "grpc_listen": ["127.0.0.1:0"],
        "grpc_tls_cert": str(files[cert]),
        "grpc_tls_key": str(files[key]),
        "grpc_tls_client_ca": None if client_ca is None else str(files[client_ca]),
    }
    with pytest.raises(ConfigError) as caught:
        server_settings(argparse.Namespace(**values), {})
    assert caught.value.option == flag


def test_a_ca_bundle_with_comments_in_any_encoding_loads(files: dict[str, Path]):
    """Only the PEM blocks are read: a bundle whose comments are not ASCII (as system
    bundles' may be) loads, as grpc reads it."""
    pem = files["cert"].read_bytes()
    check_ca("# Certigna — Ünïcode\n".encode() + pem + b"\n# and \xff\n" + pem)


def test_an_encrypted_key_is_an_error_not_a_passphrase_prompt(files: dict[str, Path]):
    """A key under a passphrase is refused at once, naming the file (OpenSSL would
    otherwise ask on the terminal, and grpc cannot use it)."""
    key = serialization.load_pem_private_key(files["key"].read_bytes(), password=None)
    encrypted = files["key"].with_name("encrypted.key")
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    with pytest.raises(TlsFileError) as caught:
        check_pair(files["cert"], encrypted)
    assert caught.value.path == encrypted
    assert str(caught.value) == f"{encrypted} is encrypted (keys are read without a passphrase)"
