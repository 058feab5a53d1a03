"""The house, checked on the source itself (import-linter holds the layers and the
per-room contracts in pyproject.toml; these are the rules it cannot express)."""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
# Every package of the product, bottom to top.
PACKAGES = ("kit", "kube", "agent", "api", "server", "client", "controller", "capwatch")
# The benchmarks: no part of the product (it never imports them, the wheel does not carry
# them), built to the same house rules: module and folder sizes, rooms that say what they
# hold, no import cycle.
BENCH = ("bench",)
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


def sources(packages: tuple[str, ...] = PACKAGES) -> list[Path]:
    """The Python files of ``packages``: the product's unless told."""
    return [
        path
        for package in packages
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
    """Every package folder of the house: the product's and the benchmarks'."""
    return sorted({path.parent for path in sources(PACKAGES + BENCH)})


@pytest.mark.parametrize(
    ("module", "allowed"),
    [
        ("pynvml", {"agent/nvml/backend.py"}),
        # The Kubernetes API is raw JSON over urllib3: the client library is not loaded.
        ("kubernetes", set()),
        ("rich", {"capwatch/watch/screen.py", "capwatch/watch/layout.py"}),
        # The HTTP edge: /readyz and /metrics of the agent, the shim and the controller.
        ("httptools", {"server/http/serving.py"}),
        # Measured and not taken (docs/architecture.md): nothing may load it.
        ("aiohttp", set()),
    ],
)
def test_external_system_imported_in_one_module_per_side(module: str, allowed: set[str]):
    """Each external system's library is imported by one module on each side (the
    terminal UI's rich: its layout and the screen that draws it)."""
    assert importers_of(module) <= allowed


@pytest.mark.parametrize(
    "module", ["grpc", "google.protobuf", "capwatch.server", "capwatch.api", "capwatch.client"]
)
def test_agent_speaks_no_wire_protocol(module: str):
    """agent/ and kit/ never import gRPC, protobuf, the api, the server or the client."""
    offenders = {p for p in importers_of(module) if p.startswith(("agent/", "kit/"))}
    assert offenders == set()


def test_no_module_over_500_lines():
    """One concept per module: split before 500 lines, in every package of the product and
    the benchmarks (generated code excepted)."""
    big = {
        path.relative_to(ROOT).as_posix(): n
        for path in sources(PACKAGES + BENCH)
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
        if name.split(".")[0] not in sys.stdlib_module_names | {"__future__"}
        and not name.startswith("capwatch.kit.")
    }
    assert outside == set()


def test_no_import_cycle():
    """No module imports itself through others, type-only imports included (the
    import-linter layers forbid cycles between rooms; this finds any inside one), in the
    product and in the benchmarks."""
    graph = grimp.build_graph("capwatch", *BENCH)
    modules = {m for m in graph.modules if m.split(".")[0] in {"capwatch", *BENCH}}
    cycles = []
    for module in sorted(modules):
        for imported in graph.find_modules_directly_imported_by(module):
            if imported in modules and imported != module:
                back = graph.find_shortest_chain(importer=imported, imported=module)
                if back is not None:
                    cycles.append((module, *back))
    assert cycles == []


def contract_containers() -> set[str]:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c for contract in contracts["contracts"] for c in contract.get("containers", ())}


def test_every_room_with_subpackages_has_a_contract_inside():
    """Contracts per subpackage: a room that holds subpackages (agent, server, controller,
    the commands, ...) is the container of an import-linter layers contract, so the
    order inside it is checked as the order between rooms is."""
    rooms = {
        "capwatch" if package == "capwatch" else f"capwatch.{package}"
        for package in PACKAGES
        if any(
            (child / "__init__.py").exists() and child.name != "__pycache__"
            for child in (ROOT / package).iterdir()
            if child.is_dir() and not child.is_symlink()
        )
    }
    assert rooms >= {"capwatch.agent", "capwatch.server", "capwatch.controller"}
    assert rooms - contract_containers() == set()
