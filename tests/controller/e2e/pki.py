"""Test certificates, made with the openssl command (EC P-256, valid one day), as
tests/server/test_tls.py makes them."""

from __future__ import annotations

import subprocess
from pathlib import Path

EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def _openssl(directory: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=30)


def make_ca(directory: Path, name: str) -> Path:
    """A self-signed CA (EC P-256, one day): ``name.pem`` and ``name.key``."""
    _openssl(
        directory, "req", "-x509", *EC, "-days", "1", "-subj", f"/CN={name}",
        "-keyout", f"{name}.key", "-out", f"{name}.pem",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return directory / f"{name}.pem"


def make_leaf(directory: Path, name: str, ca: str, extensions: str) -> tuple[Path, Path]:
    """A certificate ``ca`` signed, with ``extensions``: (certificate, key)."""
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
    return directory / f"{name}.pem", directory / f"{name}.key"
