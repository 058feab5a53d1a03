"""The installed capwatch's version, as metrics' ``build_info`` labels report it."""

from __future__ import annotations

from importlib import metadata


def package_version() -> str:
    try:
        return metadata.version("capwatch")
    except metadata.PackageNotFoundError:  # run from a source tree without installing
        return "unknown"
