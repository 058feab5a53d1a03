"""One import namespace: the wheel installs the top-level name ``capwatch`` and nothing
else, so packages of other projects named ``client`` or ``api`` live beside it.

The wheel is built from a copy of the project's own files (as the Dockerfile copies them)
and installed with packages named ``client`` and ``api`` into a fresh venv; capwatch's
dependencies come from the test's own environment, read through a path file."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.test_architecture import PACKAGES, imported_modules, sources

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow

# Other projects' packages with the common names capwatch's folders have.
FOREIGN = ("client", "api")


def build_wheel(project: Path, out: Path) -> Path:
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"),
            *("--no-build-isolation", "--no-index", "--wheel-dir", str(out), str(project)),
        ],
        check=True,
        cwd=project,
    )
    (wheel,) = out.glob(f"{project.name.replace('-', '_')}-*.whl")
    return wheel


def foreign_project(name: str, into: Path) -> Path:
    project = into / name
    (project / name).mkdir(parents=True)
    (project / name / "__init__.py").write_text(f'OWNER = "the {name} project"\n')
    (project / "pyproject.toml").write_text(
        f'[project]\nname = "{name}"\nversion = "1.0"\n'
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
    )
    return project


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A fresh venv holding capwatch's wheel and the two foreign packages; the wheel."""
    work = tmp_path_factory.mktemp("namespace")
    source = work / "capwatch"
    source.mkdir()
    shutil.copy(ROOT / "pyproject.toml", source)
    shutil.copy(ROOT / "README.md", source)
    for folder in PACKAGES:
        shutil.copytree(
            ROOT / folder,
            source / folder,
            symlinks=True,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    wheels = work / "wheels"
    wheel = build_wheel(source, wheels)
    others = [build_wheel(foreign_project(name, work / "foreign"), wheels) for name in FOREIGN]
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"),
            *("--no-deps", "--no-index", str(wheel), *map(str, others)),
        ],
        check=True,
    )
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # capwatch's dependencies, from this environment: a path file adds the directory to
    # sys.path without running its own path files (so no editable capwatch comes along).
    here = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(purelib) / "dependencies.pth").write_text("\n".join(sorted(here)) + "\n")
    return venv, wheel


def run_in(venv: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME"}}
    return subprocess.run(
        argv, cwd=venv, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_wheel_installs_only_the_capwatch_name(installed: tuple[Path, Path]):
    """Every file of the wheel is under capwatch/ or its dist-info: no top-level agent,
    server, client, api, controller or kit in site-packages."""
    _, wheel = installed
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"capwatch"}
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert "capwatch/py.typed" in names
    assert any(n.startswith("capwatch/agent/sim/scenarios/") for n in names)


def test_the_cli_runs_beside_packages_named_client_and_api(installed: tuple[Path, Path]):
    """The console script answers --help, and the foreign client and api are still the
    foreign ones (capwatch overwrote nothing of theirs)."""
    venv, _ = installed
    helped = run_in(venv, str(venv / "bin" / "capwatch"), "--help")
    assert helped.returncode == 0, helped.stderr
    assert "agent" in helped.stdout
    owners = run_in(
        venv,
        str(venv / "bin" / "python"),
        "-c",
        "import api, client; print(api.OWNER, client.OWNER)",
    )
    assert owners.stdout.split() == ["the", "api", "project", "the", "client", "project"], (
        owners.stderr
    )


def test_every_installed_module_imports_from_the_installed_tree(installed: tuple[Path, Path]):
    """Each module of the installed capwatch imports, from the venv's site-packages (a
    leftover ``from agent...`` would find nothing, or the foreign package)."""
    venv, _ = installed
    script = (
        "import importlib, pkgutil, sys, capwatch\n"
        "bad = []\n"
        "for info in pkgutil.walk_packages(capwatch.__path__, 'capwatch.'):\n"
        "    module = importlib.import_module(info.name)\n"
        "    if not module.__file__.startswith(sys.prefix):\n"
        "        bad.append(module.__name__)\n"
        "print(len(list(pkgutil.walk_packages(capwatch.__path__, 'capwatch.'))), bad)\n"
    )
    imported = run_in(venv, str(venv / "bin" / "python"), "-c", script)
    assert imported.returncode == 0, imported.stderr
    count, bad = imported.stdout.split(" ", 1)
    assert int(count) > 150
    assert bad.strip() == "[]"


def test_the_installed_agent_finds_its_packaged_scenario(installed: tuple[Path, Path]):
    """The simulator's default scenario is read from the installed package's data (by its
    package name, which only capwatch.agent.sim is)."""
    venv, _ = installed
    script = (
        "from capwatch.agent.sim.scenario import default_scenario\n"
        "print(len(default_scenario().gpus))\n"
    )
    loaded = run_in(venv, str(venv / "bin" / "python"), "-c", script)
    assert loaded.returncode == 0, loaded.stderr
    assert int(loaded.stdout) > 0


def test_no_string_names_a_room_module_by_its_bare_name():
    """importlib.resources, import_module, logger names: a string naming ``agent.sim`` finds
    nothing in the wheel (the real node found one). Every module path the product spells
    out starts with ``capwatch.``."""
    bare = re.compile(rf"^({'|'.join(set(PACKAGES) - {'capwatch'})})(\.[a-z_]+)+$")
    found = {
        f"{path.relative_to(ROOT)}:{node.lineno}: {node.value}"
        for path in sources()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and bare.match(node.value)
    }
    assert found == set()


def test_the_source_imports_its_rooms_only_through_capwatch():
    """No module of the product imports a room by its folder's bare name (``agent.x``):
    in the wheel there is no such package, or another project's."""
    bare = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in sources()
        for name in imported_modules(path)
        if name.split(".")[0] in set(PACKAGES) - {"capwatch"}
    }
    assert bare == set()
