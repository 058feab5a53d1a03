"""Generate tools/kube/go.mod's replace block from k8s.io/kubernetes' own go.mod.

k8s.io/kubernetes points every staging module (k8s.io/api, k8s.io/client-go, ...)
at ``./staging/src/...`` and requires them at ``v0.0.0``. Those replace lines are
ignored when k8s.io/kubernetes is a dependency, and the staging directories are
not in its module zip, so a module that builds the kube-* commands must replace
each of them with the published ``v0.MINOR.PATCH`` of the same release itself.
The list changes between releases (staging modules come and go; v1.37.2 has 33),
so rather than being typed by hand it is derived from the pinned release's go.mod,
which ``go mod download -json`` fetches from the module proxy.

    python3 tools/kube/genreplace.py          # rewrite the generated block in go.mod
    python3 tools/kube/genreplace.py --check  # exit 1 if the block is stale
    python3 tools/kube/genreplace.py --check --go-mod OTHER/go.mod   # another file

The generated section also carries the release's ``godebug`` line: its go.mod
sets the GODEBUG defaults the binaries are tested with, and a dependency's
godebug lines (like its replaces) count only in the main module.

Run ``go mod tidy`` in tools/kube after a rewrite. Python 3.11 stdlib only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
GO_MOD = HERE / "go.mod"
KUBERNETES = "k8s.io/kubernetes"
BEGIN = "// BEGIN genreplace.py: generated from {module}@{version}'s go.mod; do not edit."
END = "// END genreplace.py"
BEGIN_RE = re.compile(r"^// BEGIN genreplace\.py.*$", re.MULTILINE)
END_RE = re.compile(r"^// END genreplace\.py[ \t]*$", re.MULTILINE)
# A staging replace line in k8s.io/kubernetes' go.mod: `k8s.io/api => ./staging/src/k8s.io/api`.
STAGING_RE = re.compile(
    r"^\s*(?:replace\s+)?(k8s\.io/[A-Za-z0-9._/-]+)\s+=>\s+\./staging/src/(\S+)\s*$"
)
REQUIRE_RE = re.compile(r"^\s*(?:require\s+)?k8s\.io/kubernetes\s+(v1\.\d+\.\d+\S*)\s*(?://.*)?$")
GODEBUG_RE = re.compile(r"^godebug\s+.*$")
RELEASE_RE = re.compile(r"^v1\.(\d+\.\d+(?:-[0-9A-Za-z.-]+)?)$")


class GenError(Exception):
    """The block cannot be generated; the message says why."""


@dataclass(frozen=True)
class Upstream:
    """What the generated block is made of, read from one release's go.mod."""

    version: str
    staging: tuple[str, ...]
    godebug: tuple[str, ...]


def pinned_version(go_mod_text: str) -> str:
    """The k8s.io/kubernetes version that our go.mod requires."""
    for line in go_mod_text.splitlines():
        found = REQUIRE_RE.match(line)
        if found:
            return found.group(1)
    raise GenError(f"go.mod does not require {KUBERNETES}")


def staging_version(release: str) -> str:
    """The staging modules' tag for a release: v1.37.2 -> v0.37.2 (how k8s publishes them)."""
    found = RELEASE_RE.match(release)
    if not found:
        raise GenError(f"{KUBERNETES} {release} is not a v1.X.Y release")
    return f"v0.{found.group(1)}"


def upstream_go_mod(version: str) -> str:
    """The text of k8s.io/kubernetes@version's go.mod, via the go command's module cache."""
    go = shutil.which("go")
    if go is None:
        raise GenError("the go command is not on PATH")
    # GOFLAGS=-mod=mod: the download must not depend on our (possibly stale) go.mod.
    env = {**os.environ, "GOFLAGS": "-mod=mod"}
    done = subprocess.run(
        [go, "mod", "download", "-json", f"{KUBERNETES}@{version}"],
        capture_output=True,
        text=True,
        cwd=HERE,
        env=env,
        check=False,
    )
    try:
        info = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise GenError(f"go mod download failed: {done.stderr.strip()}") from None
    if done.returncode != 0 or "Error" in info:
        raise GenError(f"go mod download failed: {info.get('Error', done.stderr.strip())}")
    return Path(info["GoMod"]).read_text(encoding="utf-8")


def parse_upstream(version: str, text: str) -> Upstream:
    """The staging modules (sorted, as go.mod lists them) and godebug lines of a release."""
    staging = []
    for line in text.splitlines():
        found = STAGING_RE.match(line)
        if found:
            module, path = found.groups()
            if module != path:
                raise GenError(f"unexpected staging layout: {line.strip()}")
            staging.append(module)
    if not staging:
        raise GenError(f"{KUBERNETES}@{version}'s go.mod has no ./staging replace lines")
    godebug = tuple(line.strip() for line in text.splitlines() if GODEBUG_RE.match(line))
    return Upstream(version=version, staging=tuple(sorted(staging)), godebug=godebug)


def render_block(upstream: Upstream) -> str:
    """The generated section, markers included, without a trailing newline."""
    tag = staging_version(upstream.version)
    lines = [BEGIN.format(module=KUBERNETES, version=upstream.version)]
    lines.extend(upstream.godebug)
    if upstream.godebug:
        lines.append("")
    lines.append("replace (")
    # Unaligned, one space each side: the layout `go mod tidy` rewrites go.mod to,
    # so that --check passes after a tidy.
    lines.extend(f"\t{module} => {module} {tag}" for module in upstream.staging)
    # `go mod tidy` puts a blank line between a block and a comment after it.
    lines.extend([")", "", END])
    return "\n".join(lines)


def splice(go_mod_text: str, block: str) -> str:
    """go.mod with its generated section replaced by block (appended when there is none)."""
    begin = BEGIN_RE.search(go_mod_text)
    end = END_RE.search(go_mod_text)
    if begin is None and end is None:
        return go_mod_text.rstrip("\n") + "\n\n" + block + "\n"
    if begin is None or end is None or end.start() < begin.start():
        raise GenError("go.mod: BEGIN/END genreplace.py markers are unbalanced")
    return go_mod_text[: begin.start()] + block + go_mod_text[end.end() :]


def normalized(go_mod_text: str) -> list[list[str]]:
    """go.mod as lists of words, blank lines dropped: how --check compares, so that
    spacing which `go mod tidy` or gofmt-style editors change is no staleness."""
    return [line.split() for line in go_mod_text.splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if go.mod's block is stale")
    parser.add_argument("--go-mod", type=Path, default=GO_MOD, help=f"default: {GO_MOD}")
    args = parser.parse_args(argv)
    go_mod: Path = args.go_mod
    try:
        current = go_mod.read_text(encoding="utf-8")
        version = pinned_version(current)
        upstream = parse_upstream(version, upstream_go_mod(version))
        wanted = splice(current, render_block(upstream))
    except (GenError, OSError) as err:
        print(f"genreplace: {err}", file=sys.stderr)
        return 2
    stale = normalized(wanted) != normalized(current)
    if args.check:
        if stale:
            print(
                f"genreplace: {go_mod} is stale for {KUBERNETES} {version}; "
                "run python3 tools/kube/genreplace.py && (cd tools/kube && go mod tidy)",
                file=sys.stderr,
            )
            return 1
        print(f"genreplace: {go_mod} is up to date ({len(upstream.staging)} staging modules)")
        return 0
    if stale:
        go_mod.write_text(wanted, encoding="utf-8")
        print(f"genreplace: wrote {len(upstream.staging)} replace lines for {version}")
    else:
        print("genreplace: go.mod already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
