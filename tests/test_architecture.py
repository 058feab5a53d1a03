"""Layering rules, checked on the source itself (import-linter covers agent -> server too)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "server")


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def importers_of(top: str) -> set[str]:
    found = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if any(m == top or m.startswith(top + ".") for m in imported_modules(path)):
                found.add(path.relative_to(ROOT).as_posix())
    return found


@pytest.mark.parametrize(
    ("module", "allowed"),
    [
        ("pynvml", {"agent/nvml.py"}),
        ("kubernetes", {"agent/kubernetes.py"}),
    ],
)
def test_external_system_imported_in_one_module_only(module: str, allowed: set[str]):
    """Each external system's client library is imported by exactly one module."""
    assert importers_of(module) == allowed


@pytest.mark.parametrize("module", ["grpc", "google.protobuf", "server"])
def test_agent_speaks_no_wire_protocol(module: str):
    """agent/ never imports gRPC, protobuf or the server package."""
    offenders = {p for p in importers_of(module) if p.startswith("agent/")}
    assert offenders == set()


def test_no_module_over_500_lines():
    """One concept per module: split before 500 lines (generated code excepted)."""
    big = {
        path.relative_to(ROOT).as_posix(): n
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if "_pb2" not in path.name and (n := len(path.read_text().splitlines())) > 500
    }
    assert big == {}


def test_the_shared_broadcast_knows_nothing_of_what_it_carries():
    """server/broadcast.py serves the node's Watch and, later, the controller's cluster
    stream: it imports no agent, server or protocol module, only the standard library."""
    imported = imported_modules(ROOT / "server" / "broadcast.py")
    assert imported <= {"__future__", "asyncio", "enum", "time", "types", "typing"}
