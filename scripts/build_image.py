"""Build capwatch's image from the project's Dockerfile, with no container registry.

    python3 scripts/build_image.py [--out build/image] [--cache DIR]

These machines reach Debian's packages and PyPI but no registry, so the two
base images the Dockerfile starts from (``BUILD_BASE``, ``RUNTIME_BASE``;
``python:3.11-slim`` elsewhere) are made from Debian packages with mmdebstrap:
bookworm's ``essential`` set plus python3 (and python3-venv for the build
stage), merged /usr, no documentation. buildah (daemonless, OS package) then
builds the unchanged Dockerfile on them: every Python package comes from the
hashed lock ``requirements/image.txt``. The result is written as an OCI
archive, ``OUT/capwatch-<version>.oci.tar``, whose one manifest is named
``localhost/capwatch:<version>``; the last two lines printed are the archive's
path and that reference.

The base root filesystems and buildah's storage live in a cache outside the
checkout (``--cache``, else ``$CAPWATCH_IMAGE_CACHE``, else
``${XDG_CACHE_HOME:-~/.cache}/capwatch/image``), keyed by what makes them, so
only the first build runs mmdebstrap (about a minute each). Needs root (buildah
and mmdebstrap), and pip's settings on this machine (index, CA file) are
passed to the build's pip as mounted files, never into the image.

Errors are one line on stderr and exit status 1. Python 3.11 stdlib only.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUITE = "bookworm"
REPOSITORY = "localhost/capwatch"
# What mmdebstrap leaves out of every base: a read-only image has no reader for them.
EXCLUDED = (
    "/usr/share/man/*",
    "/usr/share/doc/*",
    "/usr/share/info/*",
    "/usr/share/locale/*",
    "/usr/share/lintian/*",
)
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TOOLS = ("mmdebstrap", "buildah")


class ImageError(Exception):
    """The image cannot be built; the message is one line saying why."""


@dataclass(frozen=True, kw_only=True)
class Base:
    """One base image made from Debian packages: its build argument and its packages."""

    argument: str
    name: str
    packages: tuple[str, ...]

    def key(self) -> str:
        """The cache key: every input of mmdebstrap's run (and its version)."""
        digest = hashlib.sha256()
        for part in (SUITE, *self.packages, *EXCLUDED, tool_version("mmdebstrap")):
            digest.update(part.encode() + b"\0")
        return digest.hexdigest()[:12]

    def reference(self) -> str:
        return f"localhost/{self.name}:{SUITE}-{self.key()}"


# libstdc++6: grpcio's extension links it (python:3.11-slim has it; the essential set has not).
RUNTIME_PACKAGES = ("python3", "libstdc++6")
BASES = (
    Base(argument="RUNTIME_BASE", name="capwatch-base", packages=RUNTIME_PACKAGES),
    Base(
        argument="BUILD_BASE",
        name="capwatch-base-build",
        packages=(*RUNTIME_PACKAGES, "python3-venv"),
    ),
)


@dataclass(frozen=True, kw_only=True)
class Built:
    """What a build produced."""

    archive: Path
    reference: str
    unpacked_bytes: int
    archive_bytes: int


def version() -> str:
    """capwatch's version, from pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return str(project["project"]["version"])


def require_tools() -> None:
    """Refuse, in one line, where the build cannot run."""
    if os.geteuid() != 0:
        raise ImageError("building the image needs root (buildah and mmdebstrap)")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise ImageError(
            f"{', '.join(missing)} not found: apt-get install {' '.join(missing)} (Debian)"
        )


def tool_version(tool: str) -> str:
    done = subprocess.run([tool, "--version"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or done.stderr.strip()


def run(command: Sequence[str], what: str, *, quiet: bool = False) -> str:
    """stdout of command, or an ImageError naming what failed and its last line of output."""
    done = subprocess.run(
        list(command),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if quiet else None,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        tail = (done.stderr or "").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        raise ImageError(f"{what} failed: {tail[0]}")
    return done.stdout


def cache_root(cache: Path | None) -> Path:
    if cache is not None:
        return cache.expanduser().resolve()
    explicit = os.environ.get("CAPWATCH_IMAGE_CACHE")
    if explicit:
        return Path(explicit).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser().resolve() / "capwatch" / "image"


@contextmanager
def locked(root: Path) -> Iterator[None]:
    """One build at a time per cache: buildah's storage and the rootfs files are shared."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class Buildah:
    """buildah on a private storage under the cache (never the host's /var/lib/containers)."""

    def __init__(self, root: Path) -> None:
        self._flags = [
            "--root",
            str(root / "storage"),
            "--runroot",
            str(root / "run"),
            "--storage-driver",
            "overlay",
        ]

    def __call__(self, *args: str, what: str, quiet: bool = False) -> str:
        return run(["buildah", *self._flags, *args], what, quiet=quiet)

    def quietly(self, *args: str) -> None:
        """Run a clean-up command whose failure changes nothing (a container already gone)."""
        subprocess.run(["buildah", *self._flags, *args], capture_output=True, check=False)

    def has(self, reference: str) -> bool:
        done = subprocess.run(
            ["buildah", *self._flags, "inspect", "--type", "image", reference],
            capture_output=True,
            check=False,
        )
        return done.returncode == 0


def rootfs(base: Base, root: Path) -> Path:
    """The base's root filesystem tarball, made with mmdebstrap unless cached."""
    target = root / f"{base.name}-{SUITE}-{base.key()}.tar"
    if target.is_file():
        return target
    print(f"build_image: mmdebstrap {SUITE} + {', '.join(base.packages)}", flush=True)
    staging = target.with_suffix(".partial.tar")
    command = [
        "mmdebstrap",
        "--quiet",
        "--variant=essential",
        f"--include={','.join(base.packages)}",
        # /usr merged by a hook rather than the usrmerge package, which pulls in perl.
        "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
        *(f"--dpkgopt=path-exclude={pattern}" for pattern in EXCLUDED),
        SUITE,
        str(staging),
    ]
    try:
        run(command, f"mmdebstrap of {base.name}")
        staging.rename(target)
    finally:
        staging.unlink(missing_ok=True)
    return target


def import_base(base: Base, root: Path, buildah: Buildah) -> str:
    """The base as an image in buildah's storage (from its rootfs), its reference."""
    reference = base.reference()
    if buildah.has(reference):
        return reference
    tarball = rootfs(base, root)
    container = buildah("from", "scratch", what="buildah from scratch", quiet=True).strip()
    try:
        buildah("add", "--quiet", container, str(tarball), "/", what="buildah add", quiet=True)
        buildah(
            "config",
            "--env",
            f"PATH={DEFAULT_PATH}",
            "--cmd",
            "/bin/sh",
            container,
            what="buildah config",
            quiet=True,
        )
        buildah("commit", "--quiet", container, reference, what="buildah commit", quiet=True)
    finally:
        buildah.quietly("rm", container)
    return reference


def pip_settings() -> tuple[str, list[Path]]:
    """A pip.conf carrying this machine's index and CA settings, and the files it names.

    The build's pip runs in a container on the host's network; without the host's
    settings it would miss a mirror or a private CA. Nothing of it lands in the image.
    """
    settings: dict[str, str] = {}
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        check=False,
    )
    for line in listed.stdout.splitlines():
        key, _, value = line.partition("=")
        section, _, name = key.partition(".")
        if section in {"global", "install", ":env:"} and name:
            settings[name] = value.strip().strip("'\"")
    for name in ("index-url", "extra-index-url", "trusted-host", "cert"):
        explicit = os.environ.get("PIP_" + name.upper().replace("-", "_"))
        if explicit:
            settings[name] = explicit
    kept = {
        name: value
        for name, value in settings.items()
        if name in {"index-url", "extra-index-url", "trusted-host", "cert", "timeout"}
    }
    files = [Path(kept["cert"])] if "cert" in kept and Path(kept["cert"]).is_file() else []
    if "cert" in kept and not files:
        del kept["cert"]
    body = "[global]\n" + "".join(f"{name} = {value}\n" for name, value in sorted(kept.items()))
    return body, files


def unpacked_size(archive: Path) -> int:
    """Bytes of every layer, uncompressed: what the image takes on a node's disk."""
    total = 0
    with tarfile.open(archive) as outer:
        index = json.load(_member(outer, "index.json"))
        manifest_digest = index["manifests"][0]["digest"]
        manifest = json.load(_member(outer, "blobs/" + manifest_digest.replace(":", "/")))
        for layer in manifest["layers"]:
            blob = _member(outer, "blobs/" + layer["digest"].replace(":", "/"))
            with tarfile.open(fileobj=blob, mode="r|*") as inner:
                total += sum(member.size for member in inner)
    return total


def _member(archive: tarfile.TarFile, name: str) -> tarfile.ExFileObject:
    handle = archive.extractfile(name)
    if handle is None:
        raise ImageError(f"the archive has no {name}")
    return handle


def build(out: Path, cache: Path | None = None) -> Built:
    """Build the image and write its OCI archive under out."""
    require_tools()
    root = cache_root(cache)
    tag = version()
    reference = f"{REPOSITORY}:{tag}"
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    archive = out / f"capwatch-{tag}.oci.tar"
    with locked(root):
        buildah = Buildah(root)
        arguments = [f"{base.argument}={import_base(base, root, buildah)}" for base in BASES]
        conf, files = pip_settings()
        pip_conf = root / "pip.conf"
        pip_conf.write_text(conf, encoding="utf-8")
        mounts = [f"{pip_conf}:/etc/pip.conf:ro", *(f"{path}:{path}:ro" for path in files)]
        print(f"build_image: buildah bud {reference}", flush=True)
        buildah(
            "bud",
            "--format",
            "oci",
            "--pull-never",
            # pip fetches from PyPI (or the host's mirror) through the host's network.
            "--network",
            "host",
            # One layer per stage and no intermediate images: nothing accumulates in the
            # storage between builds (a rebuild is about 25 s).
            "--layers=false",
            *(flag for mount in mounts for flag in ("--volume", mount)),
            *(flag for argument in arguments for flag in ("--build-arg", argument)),
            "--build-arg",
            f"VERSION={tag}",
            "--tag",
            reference,
            "--file",
            str(ROOT / "Dockerfile"),
            str(ROOT),
            what="buildah bud",
        )
        partial = archive.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        buildah(
            "push",
            "--quiet",
            reference,
            f"oci-archive:{partial}:{reference}",
            what="buildah push",
            quiet=True,
        )
        partial.rename(archive)
        # The previous build's image, untagged by this one.
        buildah.quietly("rmi", "--prune")
    return Built(
        archive=archive,
        reference=reference,
        unpacked_bytes=unpacked_size(archive),
        archive_bytes=archive.stat().st_size,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "image")
    parser.add_argument("--cache", type=Path, default=None, help="base images and storage")
    args = parser.parse_args(argv)
    try:
        built = build(args.out, args.cache)
    except ImageError as err:
        print(f"build_image: {err}", file=sys.stderr)
        return 1
    except OSError as err:
        print(f"build_image: {err.strerror}: {err.filename}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("build_image: interrupted", file=sys.stderr)
        return 130
    mib = 1024 * 1024
    print(
        f"build_image: {built.reference}: {built.unpacked_bytes / mib:.0f} MiB unpacked, "
        f"{built.archive_bytes / mib:.0f} MiB archive"
    )
    print(built.archive)
    print(built.reference)
    return 0


if __name__ == "__main__":
    sys.exit(main())
