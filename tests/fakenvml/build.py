"""Build the fake ``libnvidia-ml.so.1`` against the official ``nvml.h``.

Importable (:func:`build`) and runnable (``python tests/fakenvml/build.py
[OUTDIR]``, default ``build/fakenvml``); prints the output directory, which is
what goes on ``LD_LIBRARY_PATH``. Every ``*.c`` in this directory goes into the
one library. It is rebuilt only when a source, a header (ours or ``nvml.h``) or
the compiler flags changed (a content hash is kept next to it).
Standard library only, so it runs before anything else is set up.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SONAME = "libnvidia-ml.so.1"
HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
DEFAULT_OUTDIR = REPO_ROOT / "build" / "fakenvml"
# -Wmissing-prototypes: every exported NVML function must be declared by
# nvml.h, so a misspelt or misversioned entry point fails the build.
CFLAGS = (
    "-shared",
    "-fPIC",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wmissing-prototypes",
    "-Wstrict-prototypes",
    "-Wshadow",
    "-O2",
    "-std=gnu11",
)
LDFLAGS = (f"-Wl,-soname,{SONAME}", "-lpthread")
_STAMP = ".build-hash"


class BuildError(RuntimeError):
    """The header could not be found or the compiler failed."""


def find_header() -> Path:
    """Locate ``nvml.h`` from the installed ``nvidia-nvml-dev`` (``nvidia/*/include``).

    ``NVML_INCLUDE_DIR`` overrides the search. When several CUDA flavours are
    installed, the highest (by directory name, e.g. ``cu13`` over ``cu12``) wins.
    """
    override = os.environ.get("NVML_INCLUDE_DIR")
    if override:
        header = Path(override) / "nvml.h"
        if not header.is_file():
            raise BuildError(f"NVML_INCLUDE_DIR={override} has no nvml.h")
        return header
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations or []) if spec else []
    found = sorted(
        (h for root in roots for h in Path(root).glob("*/include/nvml.h")),
        key=lambda h: h.parent.parent.name,
    )
    if not found:
        raise BuildError(
            "nvml.h not found under the `nvidia` package; install the dev extras "
            "(pip install -e '.[dev]', which brings nvidia-nvml-dev) or set NVML_INCLUDE_DIR"
        )
    return found[-1]


def _inputs(source_dir: Path) -> tuple[list[Path], list[Path]]:
    sources = sorted(source_dir.glob("*.c"))
    if not sources:
        raise BuildError(f"no C sources in {source_dir}")
    return sources, sorted(source_dir.glob("*.h"))


def _digest(files: list[Path], header: Path, compiler: str) -> str:
    h = hashlib.sha256()
    for path in files:
        for part in (path.name.encode(), path.read_bytes()):
            h.update(len(part).to_bytes(8, "big"))
            h.update(part)
    for part in (header.read_bytes(), str(header).encode()):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    h.update(" ".join((compiler, *CFLAGS, *LDFLAGS)).encode())
    return h.hexdigest()


def build(
    outdir: Path | str = DEFAULT_OUTDIR, *, source_dir: Path = HERE, force: bool = False
) -> Path:
    """Compile ``source_dir/*.c`` into ``outdir/libnvidia-ml.so.1`` if needed; return ``outdir``."""
    out = Path(outdir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    header = find_header()
    compiler = os.environ.get("CC", "gcc")
    sources, headers = _inputs(source_dir)
    digest = _digest(sources + headers, header, compiler)
    library = out / SONAME
    stamp = out / _STAMP
    if not force and library.is_file() and stamp.is_file() and stamp.read_text().strip() == digest:
        return out
    # Compile to a temporary name and rename: a process that has the old
    # library mapped keeps its copy, and nobody ever sees a half-written file.
    fd, tmp_name = tempfile.mkstemp(prefix=".fake_nvml-", suffix=".so", dir=out)
    os.close(fd)
    tmp = Path(tmp_name)
    cmd = [
        compiler,
        *CFLAGS,
        f"-I{source_dir}",
        f"-I{header.parent}",
        f'-DFAKENVML_BUILD_ID="{digest}"',
        "-o",
        str(tmp),
        *map(str, sources),
        *LDFLAGS,
    ]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise BuildError(f"compiling failed ({' '.join(cmd)}):\n{result.stderr.strip()}")
        tmp.chmod(0o755)
        tmp.replace(library)
    finally:
        tmp.unlink(missing_ok=True)
    stamp.write_text(digest + "\n")
    return out


def build_id(outdir: Path | str = DEFAULT_OUTDIR) -> str:
    """The id of the library last built into ``outdir`` (what ``fakenvml_build_id`` returns)."""
    return (Path(outdir) / _STAMP).read_text().strip()


def main(argv: list[str]) -> int:
    """Entry point: ``build.py [OUTDIR]``; prints the directory to put on LD_LIBRARY_PATH."""
    if len(argv) > 2:
        sys.stderr.write("usage: build.py [OUTDIR]\n")
        return 2
    try:
        out = build(argv[1] if len(argv) == 2 else DEFAULT_OUTDIR)
    except (BuildError, OSError) as exc:
        sys.stderr.write(f"fakenvml build failed: {exc}\n")
        return 1
    sys.stdout.write(f"{out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
