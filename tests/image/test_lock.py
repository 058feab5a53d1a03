"""The image's lock (requirements/image.txt, `make lock`) is complete and hashed.

The image installs from the lock alone (pip --require-hashes --no-deps), so a
dependency added to pyproject.toml but not locked would be missing from the
image, and a version outside pyproject's range would be untested there.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "image.txt"
PIN = re.compile(r"^([A-Za-z0-9._-]+)==(\S+)")


def locked() -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) for every requirement in the lock."""
    entries: dict[str, tuple[str, list[str]]] = {}
    text = LOCK.read_text(encoding="utf-8").replace("\\\n", " ")
    for line in text.splitlines():
        found = PIN.match(line.strip())
        if found:
            hashes = re.findall(r"--hash=sha256:([0-9a-f]{64})", line)
            entries[canonicalize_name(found.group(1))] = (found.group(2), hashes)
    return entries


def test_every_dependency_is_locked_within_its_range() -> None:
    """Each of pyproject's dependencies is pinned in the lock to a version it allows,
    and the build backend the image installs capwatch with is there too."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = locked()
    for spec in project["dependencies"]:
        requirement = Requirement(spec)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is not in {LOCK.name}: make lock"
        assert requirement.specifier.contains(pins[name][0]), f"{name} {pins[name][0]}: make lock"
    assert "setuptools" in pins


def test_every_locked_package_carries_hashes() -> None:
    """pip --require-hashes refuses a line without one: every pin has at least one."""
    pins = locked()
    assert len(pins) > 10
    assert [name for name, (_, hashes) in pins.items() if not hashes] == []
