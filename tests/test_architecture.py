"""The house, checked on the source itself (import-linter holds the layers and the
per-room contracts in pyproject.toml; these are the rules it cannot express)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
# Every package of the product, bottom to top.
PACKAGES = ("kit", "agent", "api", "server", "client", "controller", "capwatch")
GENERATED = ROOT / "api" / "gen"
MAX_MODULES_PER_FOLDER = 20


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def sources() -> list[Path]:
    return [
        path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if not path.is_relative_to(GENERATED)
    ]


def importers_of(top: str) -> set[str]:
    return {
        path.relative_to(ROOT).as_posix()
        for path in sources()
        if any(m == top or m.startswith(top + ".") for m in imported_modules(path))
    }


def folders() -> list[Path]:
    return sorted({path.parent for path in sources()})


@pytest.mark.parametrize(
    ("module", "allowed"),
    [
        ("pynvml", {"agent/nvml/backend.py"}),
        # The Kubernetes API is raw JSON over urllib3: the client library is not loaded.
        ("kubernetes", set()),
        ("rich", {"capwatch/watch/screen.py", "capwatch/watch/layout.py"}),
    ],
)
def test_external_system_imported_in_one_module_per_side(module: str, allowed: set[str]):
    """Each external system's library is imported by one module on each side (the
    terminal UI's rich: its layout and the screen that draws it)."""
    assert importers_of(module) <= allowed


@pytest.mark.parametrize("module", ["grpc", "google.protobuf", "server", "api", "client"])
def test_agent_speaks_no_wire_protocol(module: str):
    """agent/ and kit/ never import gRPC, protobuf, the api, the server or the client."""
    offenders = {p for p in importers_of(module) if p.startswith(("agent/", "kit/"))}
    assert offenders == set()


def test_no_module_over_500_lines():
    """One concept per module: split before 500 lines, in every package (generated code
    excepted)."""
    big = {
        path.relative_to(ROOT).as_posix(): n
        for path in sources()
        if (n := len(path.read_text().splitlines())) > 500
    }
    assert big == {}


def test_no_folder_holds_more_than_twenty_modules():
    """Rooms a reader can take in: no package folder of more than 20 modules (its
    ``__init__`` aside); past that it gets subpackages."""
    crowded = {
        folder.relative_to(ROOT).as_posix(): n
        for folder in folders()
        if (n := sum(1 for p in folder.glob("*.py") if p.name != "__init__.py"))
        > MAX_MODULES_PER_FOLDER
    }
    assert crowded == {}


def test_every_package_says_what_lives_there():
    """Each package's ``__init__`` opens with a docstring of what lives there and what it
    may import."""
    silent = []
    for folder in folders():
        init = folder / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text())) if init.exists() else None
        if not doc or "import" not in doc.lower():
            silent.append(folder.relative_to(ROOT).as_posix())
    assert silent == []


def test_the_shared_broadcast_knows_nothing_of_what_it_carries():
    """kit/broadcast.py serves the node's Watch and the controller's cluster stream: it
    imports no agent, server or protocol module, only the standard library."""
    imported = imported_modules(ROOT / "kit" / "broadcast.py")
    assert {name.split(".")[0] for name in imported} <= sys.stdlib_module_names | {"__future__"}


def test_the_kit_imports_only_the_standard_library_and_itself():
    """kit/ is the bottom of the house: nothing of capwatch above it, no third party."""
    outside = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in (ROOT / "kit").rglob("*.py")
        for name in imported_modules(path)
        if name.split(".")[0] not in sys.stdlib_module_names | {"__future__", "kit"}
    }
    assert outside == set()


def test_no_import_cycle():
    """No module imports itself through others, type-only imports included (the
    import-linter layers forbid cycles between rooms; this finds any inside one)."""
    graph = grimp.build_graph(*PACKAGES)
    modules = {m for m in graph.modules if m.split(".")[0] in PACKAGES}
    cycles = []
    for module in sorted(modules):
        for imported in graph.find_modules_directly_imported_by(module):
            if imported in modules and imported != module:
                back = graph.find_shortest_chain(importer=imported, imported=module)
                if back is not None:
                    cycles.append((module, *back))
    assert cycles == []
