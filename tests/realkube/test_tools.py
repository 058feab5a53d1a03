"""tools/kube/genreplace.py and scripts/build_kube.py: the generated replace block, the
version stamp, and the cache's key and completeness rules."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.loadfile import load_module
from tests.realkube.controlplane import build_kube

ROOT = Path(__file__).resolve().parents[2]
GENREPLACE = ROOT / "tools" / "kube" / "genreplace.py"

UPSTREAM = """module k8s.io/kubernetes

go 1.26.0

godebug default=go1.26

require (
\tk8s.io/api v0.0.0
\tk8s.io/client-go v0.0.0
)

replace (
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
\tk8s.io/api => ./staging/src/k8s.io/api
)
"""

OURS = """module capwatch/tools/kube

go 1.26.0

require k8s.io/kubernetes v1.37.2
"""


def genreplace() -> ModuleType:
    """tools/kube/genreplace.py, imported as a module (tools/ is not a package)."""
    return load_module("capwatch_genreplace", GENREPLACE)


def needs_go() -> None:
    if shutil.which("go") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the go command is not on PATH in CI", pytrace=False)
        pytest.skip("the go command is not on PATH")


def test_replace_block_comes_from_the_releases_staging_lines() -> None:
    """Every ./staging replace of the release becomes `M => M v0.MINOR.PATCH`, sorted,
    with the release's godebug line: nothing is typed by hand."""
    gen = genreplace()
    upstream = gen.parse_upstream("v1.37.2", UPSTREAM)
    assert upstream.staging == ("k8s.io/api", "k8s.io/client-go")
    assert upstream.godebug == ("godebug default=go1.26",)
    block = gen.render_block(upstream)
    assert (
        "\tk8s.io/api => k8s.io/api v0.37.2\n\tk8s.io/client-go => k8s.io/client-go v0.37.2"
        in block
    )
    assert block.splitlines()[1] == "godebug default=go1.26"


def test_splice_appends_once_then_replaces_in_place() -> None:
    """The generated section is appended to a go.mod without one, and a second splice
    replaces it rather than adding another: re-running the generator is a no-op."""
    gen = genreplace()
    block = gen.render_block(gen.parse_upstream("v1.37.2", UPSTREAM))
    once = gen.splice(OURS, block)
    assert once.startswith(OURS.rstrip("\n"))
    assert gen.splice(once, block) == once
    newer = gen.render_block(gen.parse_upstream("v1.37.3", UPSTREAM))
    assert gen.splice(once, newer).count("// BEGIN genreplace.py") == 1
    assert "v0.37.3" in gen.splice(once, newer)


def test_staleness_ignores_layout_that_go_mod_tidy_changes() -> None:
    """--check compares words, not spacing: `go mod tidy`'s blank lines and tabs are not
    staleness, a missing replace line is."""
    gen = genreplace()
    block = gen.render_block(gen.parse_upstream("v1.37.2", UPSTREAM))
    text = gen.splice(OURS, block)
    assert gen.normalized(text.replace(" => ", "  =>  ") + "\n\n") == gen.normalized(text)
    dropped = "\n".join(line for line in text.splitlines() if "k8s.io/api =>" not in line)
    assert gen.normalized(dropped) != gen.normalized(text)


def test_release_versions_map_to_staging_tags() -> None:
    """v1.X.Y maps to the staging modules' v0.X.Y; anything else is refused."""
    gen = genreplace()
    assert gen.staging_version("v1.37.2") == "v0.37.2"
    assert gen.staging_version("v1.38.0-beta.0") == "v0.38.0-beta.0"
    with pytest.raises(gen.GenError):
        gen.staging_version("v0.37.2")


def test_committed_go_mod_is_fresh_and_a_stale_one_is_caught(tmp_path: Path) -> None:
    """genreplace.py --check passes on tools/kube/go.mod as committed, and exits 1 on a
    copy that lacks one replace line."""
    needs_go()
    fresh = subprocess.run(
        [sys.executable, str(GENREPLACE), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert fresh.returncode == 0, fresh.stderr
    stale = tmp_path / "go.mod"
    text = (GENREPLACE.parent / "go.mod").read_text()
    stale.write_text("\n".join(line for line in text.splitlines() if "k8s.io/api =>" not in line))
    result = subprocess.run(
        [sys.executable, str(GENREPLACE), "--check", "--go-mod", str(stale)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1
    assert "is stale" in result.stderr


def test_kube_version_stamp_sets_both_version_packages() -> None:
    """The -X flags stamp gitVersion, gitMajor, gitMinor and the release's own date into
    both k8s.io/client-go/pkg/version and k8s.io/component-base/version."""
    module = build_kube()
    release = module.Module(
        path="k8s.io/kubernetes", version="v1.37.2", time="2026-10-27T12:01:04Z"
    )
    flags = module.kube_ldflags(release)
    for package in ("k8s.io/client-go/pkg/version", "k8s.io/component-base/version"):
        assert f"-X {package}.gitVersion=v1.37.2" in flags
        assert f"-X {package}.gitMajor=1" in flags
        assert f"-X {package}.gitMinor=37" in flags
        assert f"-X {package}.buildDate=2026-10-27T12:01:04Z" in flags
    with pytest.raises(module.BuildError):
        module.kube_ldflags(
            module.Module(path="k8s.io/kubernetes", version="v1.37.2-dirty", time="")
        )


def test_cache_key_names_the_versions_and_changes_with_the_compiler() -> None:
    """The cache directory's name carries every pinned version, and another Go version
    gives another key (so a compiler change never reuses old binaries)."""
    module = build_kube()
    modules = {
        "k8s.io/kubernetes": module.Module("k8s.io/kubernetes", "v1.37.2", ""),
        "go.etcd.io/etcd/server/v3": module.Module("go.etcd.io/etcd/server/v3", "v3.6.16", ""),
        "sigs.k8s.io/kwok": module.Module("sigs.k8s.io/kwok", "v0.8.0", ""),
    }
    key = module.cache_key(modules, "go1.26.8")
    assert key.startswith("k8s-v1.37.2_etcd-v3.6.16_kwok-v0.8.0_")
    assert module.cache_key(modules, "go1.26.9") != key
    assert module.cache_key(modules, "go1.26.8") == key


def test_cache_directory_counts_only_when_complete(tmp_path: Path) -> None:
    """A directory counts as cached only with every binary executable and kwok's stages
    present; one missing or non-executable binary makes it incomplete."""
    module = build_kube()
    for name in module.NAMES:
        path = tmp_path / name
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    assert module.complete(tmp_path) is None  # no kwok-stages.yaml yet
    (tmp_path / module.KWOK_STAGES).write_text("kind: Stage\n")
    found = module.complete(tmp_path)
    assert found is not None
    assert set(found) == {*module.NAMES, "kwok-stages"}
    (tmp_path / "kube-apiserver").chmod(0o644)
    assert module.complete(tmp_path) is None


def test_build_without_go_is_one_line(tmp_path: Path) -> None:
    """build_kube.py with no go on PATH exits 1 with one line saying so."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_kube.py"), "--cache", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PATH": str(tmp_path)},
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "build_kube: the go command is not on PATH: install Go 1.26 or newer"
    ]
