"""The image as built (make image): its config, what is in it, and what it runs.

Read from the OCI archive scripts/build_image.py writes, unpacked with umoci
and run with runc as the image says (its user, its entrypoint's PATH) on a
read-only root filesystem, as the chart runs it. Needs root, runc and umoci;
without them (or without the archive) the tests skip, except in CI.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import tomllib
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.realkube.fixtures import unavailable
from tests.realnode.prerequisites import image_archive, image_builder

ROOT = Path(__file__).resolve().parents[2]
# The one top-level name the image's capwatch has; the rooms are its subpackages.
PACKAGES = ("capwatch",)
ROOMS = ("agent", "api", "client", "controller", "kit", "kube", "server")
# Every module of every package imports: a missing dependency or system library
# (grpcio's libstdc++) fails here, not in a crash-looping pod.
IMPORT_ALL = f"""
import importlib, importlib.util, pkgutil
count = 0
for name in {PACKAGES!r}:
    top = importlib.import_module(name)
    for module in pkgutil.walk_packages(top.__path__, name + "."):
        importlib.import_module(module.name)
        count += 1
import pynvml, urllib3
assert not [r for r in {ROOMS!r} if importlib.util.find_spec(r)], "a room at the top"
print("imported", count)
"""


def version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


@pytest.fixture(scope="module")
def archive() -> Path:
    path = image_archive()
    if not path.is_file():
        unavailable(f"no image archive at {path}: make image")
    return path


def blob(archive: tarfile.TarFile, digest: str) -> Any:
    handle = archive.extractfile("blobs/" + digest.replace(":", "/"))
    assert handle is not None
    return handle


@pytest.fixture(scope="module")
def config(archive: Path) -> dict[str, Any]:
    """The image's config, found from the archive's index and manifest."""
    with tarfile.open(archive) as outer:
        index = json.load(outer.extractfile("index.json"))  # type: ignore[arg-type]
        manifest = json.load(blob(outer, index["manifests"][0]["digest"]))
        document: dict[str, Any] = json.load(blob(outer, manifest["config"]["digest"]))
    return document


@pytest.fixture(scope="module")
def bundle(archive: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image unpacked as an OCI runtime bundle (umoci), for runc."""
    if shutil.which("umoci") is None or shutil.which("runc") is None:
        unavailable("umoci and runc are needed to run the image (apt-get install umoci runc)")
    if os.geteuid() != 0:
        unavailable("running the image with runc needs root")
    layout = tmp_path_factory.mktemp("layout")
    with tarfile.open(archive) as outer:
        outer.extractall(layout, filter="tar")
    reference = image_builder().REPOSITORY + ":" + version()
    target = tmp_path_factory.mktemp("bundle") / "bundle"
    done = subprocess.run(
        ["umoci", "unpack", "--image", f"{layout}:{reference}", str(target)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return target


def run_in_image(bundle: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    """args in a container of the image: its user and environment, read-only root."""
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["args"] = args
    spec["process"]["terminal"] = False
    spec["root"]["readonly"] = True
    (bundle / "config.json").write_text(json.dumps(spec))
    return subprocess.run(
        ["runc", "run", "--bundle", str(bundle), f"capwatch-image-{uuid.uuid4().hex[:8]}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_config_names_a_non_root_user_the_cli_and_the_version(config: dict[str, Any]) -> None:
    """The image runs `capwatch` as a non-root user by default (the chart sets root for
    the agent alone), says its version in the OCI labels, and points TMPDIR at the
    writable mount the chart gives it."""
    settings = config["config"]
    assert settings["User"] == "65532:65532"
    assert settings["Entrypoint"] == ["capwatch"]
    labels = settings["Labels"]
    assert labels["org.opencontainers.image.title"] == "capwatch"
    assert labels["org.opencontainers.image.version"] == version()
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    env = dict(entry.split("=", 1) for entry in settings["Env"])
    assert env["TMPDIR"] == "/tmp"
    assert env["PATH"].startswith("/opt/venv/bin:")


def test_no_compiler_no_pip_and_no_client_library_in_the_image(bundle: Path) -> None:
    """What the build used stays in the build stage: no pip (the venv's or the
    base's), no C compiler; and no Kubernetes client library (capwatch speaks raw JSON)."""
    rootfs = bundle / "rootfs"
    pips = [path for path in rootfs.glob("**/site-packages/pip") if path.is_dir()]
    pips += list(rootfs.glob("usr/lib/python3/dist-packages/pip"))
    pips += list(rootfs.glob("**/bin/pip*"))
    assert pips == []
    compilers = [
        name for name in ("gcc", "cc", "c++", "g++", "x86_64-linux-gnu-gcc")
        if (rootfs / "usr" / "bin" / name).exists()
    ]  # fmt: skip
    assert compilers == []
    assert list(rootfs.glob("opt/venv/lib/python3*/site-packages/kubernetes")) == []


def test_the_image_runs_capwatch_version(bundle: Path) -> None:
    """`capwatch --version` in a container of the image prints the project's version."""
    done = run_in_image(bundle, ["capwatch", "--version"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"capwatch {version()}"


def test_every_module_imports_in_the_image_on_a_read_only_root(bundle: Path) -> None:
    """Every capwatch module, NVML's bindings and the Kubernetes client import in
    the image with nothing writable (the bytecode was compiled at build time), and no
    room is installed under its bare name beside capwatch."""
    done = run_in_image(bundle, ["python3", "-c", IMPORT_ALL])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("imported ")
    assert int(done.stdout.split()[1]) > 100
