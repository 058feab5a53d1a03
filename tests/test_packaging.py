"""pyproject.toml as setuptools reads it: metadata in the form it takes without a
deprecation warning on every install."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_license_is_an_spdx_expression_the_required_setuptools_takes():
    """`license` is the SPDX string (PEP 639), not the `{ text = ... }` table setuptools
    warns about three times per install; and the build requires a setuptools that reads
    the string (77.0.0 and later), with no License classifier beside it (an error then)."""
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    requires = PYPROJECT["build-system"]["requires"]
    matches = [re.fullmatch(r"setuptools>=(\d+)(?:\.\d+)*", spec) for spec in requires]
    floors = [int(match[1]) for match in matches if match]
    assert len(floors) == 1, requires
    assert floors[0] >= 77, requires
    assert not any("License ::" in c for c in PYPROJECT["project"].get("classifiers", []))


def test_the_demo_extra_is_pinned_as_dev_pins_it():
    """What `make demo` installs beyond the dependencies is in dev too, with the same
    pin: the demo's .venv and make test's agree."""
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert extras["demo"], extras
    assert set(extras["demo"]) <= set(extras["dev"]), extras["demo"]
