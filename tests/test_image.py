"""The image's build context and Dockerfile (which cannot be built here) hold every
package ``pip install .`` installs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def packages() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {p.rstrip("*") for p in config["tool"]["setuptools"]["packages"]["find"]["include"]}


def test_the_dockerfile_copies_every_installed_package():
    """A package left out of the build stage is missing from the image (the console
    script would fail to import), so each one pyproject.toml installs is copied."""
    copied = set(re.findall(r"^COPY (\w+) \./\1$", (ROOT / "Dockerfile").read_text(), re.M))
    assert copied == packages()


def test_the_build_context_lets_every_installed_package_in():
    """.dockerignore excludes everything and lets back in what the build needs."""
    allowed = set(re.findall(r"^!(\w+)/$", (ROOT / ".dockerignore").read_text(), re.M))
    assert allowed == packages()
