"""What the real node is made of, built elsewhere: capwatch's image (scripts/build_image.py).

scripts/ is not a package, so its builder is loaded from its file, as
tests/realkube loads scripts/build_kube.py.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from tests.loadfile import load_module

ROOT = Path(__file__).resolve().parents[2]
IMAGE_OUT = ROOT / "build" / "image"


def image_builder() -> ModuleType:
    """scripts/build_image.py as a module."""
    return load_module("capwatch_build_image", ROOT / "scripts" / "build_image.py")


def image_archive() -> Path:
    """Where `make image` writes the archive for this checkout's version."""
    return IMAGE_OUT / f"capwatch-{image_builder().version()}.oci.tar"


def build_image() -> Path:
    """Build the image (scripts/build_image.py) and return its archive."""
    builder = image_builder()
    try:
        built = builder.build(IMAGE_OUT)
    except builder.ImageError as err:
        raise RuntimeError(f"image build failed: {err}") from None
    return Path(built.archive)
