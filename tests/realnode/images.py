"""The real node's images without a registry: the pause image made here, archives imported.

The pause image is one statically linked file (pause.c, built with gcc) in a
one-layer OCI image written by hand: a gzipped layer tar, a config, a
manifest and an index, in the OCI image layout, as one tar archive. The same
image is the workload of the attribution test. capwatch's own image comes from
``make image`` (scripts/build_image.py). Both are imported into the node's
containerd with ``ctr images import`` under the names the pods ask for, and
the pods never pull (the node has no registry to pull from).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
PAUSE_SOURCE = HERE / "pause.c"
PAUSE_IMAGE = "localhost/capwatch-pause:1"
# The user registry.k8s.io/pause runs as: nobody's uid, no file to own.
PAUSE_USER = "65535:65535"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
# A fixed time in every archive: the same binary makes the same image digest.
EPOCH = 0


class ImageError(Exception):
    """An image could not be made or imported; one line."""


@dataclass(frozen=True, kw_only=True)
class Blob:
    """Bytes in the layout, and their descriptor."""

    data: bytes
    media_type: str

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.data).hexdigest()

    def descriptor(self) -> dict[str, object]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": len(self.data)}


def build_pause(out: Path) -> Path:
    """gcc -static pause.c into out/pause (rebuilt only when the source is newer)."""
    binary = out / "pause"
    if binary.is_file() and binary.stat().st_mtime >= PAUSE_SOURCE.stat().st_mtime:
        return binary
    compiler = shutil.which("gcc")
    if compiler is None:
        raise ImageError("gcc not found: the pause image is compiled from tests/realnode/pause.c")
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [
            compiler,
            "-static",
            "-Os",
            "-s",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
            str(binary),
            str(PAUSE_SOURCE),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ImageError(f"gcc -static pause.c failed: {last}")
    return binary


def layer_of(files: dict[str, tuple[bytes, int]]) -> tuple[bytes, bytes]:
    """A layer tar holding files (path -> (bytes, mode)), uncompressed and gzipped."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as layer:
        for path, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), mode, EPOCH
            layer.addfile(info, io.BytesIO(data))
    plain = raw.getvalue()
    return plain, gzip.compress(plain, mtime=EPOCH)


def write_archive(
    path: Path, *, reference: str, files: dict[str, tuple[bytes, int]], entrypoint: list[str]
) -> Path:
    """An OCI image-layout archive of one image named reference."""
    plain, packed = layer_of(files)
    layer = Blob(data=packed, media_type=LAYER_TYPE)
    config = Blob(
        data=json.dumps(
            {
                "architecture": "amd64",
                "os": "linux",
                "config": {"Entrypoint": entrypoint, "User": PAUSE_USER},
                "rootfs": {
                    "type": "layers",
                    "diff_ids": ["sha256:" + hashlib.sha256(plain).hexdigest()],
                },
            },
            sort_keys=True,
        ).encode(),
        media_type=CONFIG_TYPE,
    )
    manifest = Blob(
        data=json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": MANIFEST_TYPE,
                "config": config.descriptor(),
                "layers": [layer.descriptor()],
            },
            sort_keys=True,
        ).encode(),
        media_type=MANIFEST_TYPE,
    )
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                **manifest.descriptor(),
                "annotations": {"org.opencontainers.image.ref.name": reference},
            }
        ],
    }
    entries = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index, sort_keys=True).encode(),
        **{
            f"blobs/sha256/{blob.digest.removeprefix('sha256:')}": blob.data
            for blob in (layer, config, manifest)
        },
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, EPOCH
            archive.addfile(info, io.BytesIO(data))
    return path


def pause_archive(out: Path) -> Path:
    """out/pause.oci.tar: the pause image, named PAUSE_IMAGE."""
    binary = build_pause(out)
    return write_archive(
        out / "pause.oci.tar",
        reference=PAUSE_IMAGE,
        files={"pause": (binary.read_bytes(), 0o755)},
        entrypoint=["/pause"],
    )


def archive_reference(archive: Path) -> str:
    """The image name an OCI archive's index gives its one manifest."""
    try:
        with tarfile.open(archive) as outer:
            handle = outer.extractfile("index.json")
            if handle is None:
                raise ImageError(f"{archive} has no index.json")
            index = json.load(handle)
    except (OSError, tarfile.TarError, ValueError) as err:
        raise ImageError(f"{archive} is not an OCI archive: {err}") from None
    try:
        return str(index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"])
    except (KeyError, IndexError, TypeError):
        raise ImageError(f"{archive} names no image in its index.json") from None
