"""Build the real Kubernetes control plane (and a kubelet) that the tests run, from source.

No download site or container registry is reachable from the project's
machines, but the Go module proxy is: kube-apiserver, kube-controller-manager,
kube-scheduler and kubelet (k8s.io/kubernetes), etcd (go.etcd.io/etcd/server/v3) and
the KWOK controller (sigs.k8s.io/kwok/cmd/kwok) are built from the modules
pinned in tools/kube, tools/etcd and tools/kwok (one Go module each: their
dependency versions conflict).

    python3 scripts/build_kube.py [--cache DIR]   # prints the binaries' directory

Binaries go to ``DIR/<key>/`` outside the checkout, where DIR defaults to
``$CAPWATCH_KUBE_CACHE``, else ``${XDG_CACHE_HOME:-~/.cache}/capwatch/kube``,
and the key names every pinned version plus a digest of the go.mod/go.sum
files, the Go version and this script's build recipe, so any change to what
would be built builds afresh. A second run builds nothing. A build goes into
a temporary directory that is renamed into place when every binary is done,
so an interrupted build leaves no half-filled cache; a lock file keeps two
concurrent runs from building the same key twice.

A cold build takes tens of minutes on two cores (kube-apiserver alone is the
bulk); Go's own module and build caches make a rebuild after a bump faster.
Tests import :func:`ensure_binaries`. Python 3.11 stdlib only.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "tools"
MANIFEST = "build.json"
# Bumped whenever the flags below change what a build produces: part of the key.
RECIPE = "2"
HEARTBEAT_S = 30.0
# What k8s's hack/lib/golang.sh builds release binaries with (non-debug): the
# selinux tag, notest, and grpcnotrace (drops x/net/trace, smaller binaries).
KUBE_TAGS = ("selinux", "notest", "grpcnotrace")
# hack/lib/version.sh stamps both copies of the version variables.
KUBE_VERSION_PACKAGES = ("k8s.io/client-go/pkg/version", "k8s.io/component-base/version")
RELEASE_RE = re.compile(r"^v(\d+)\.(\d+)\.(\d+)$")


class BuildError(Exception):
    """The binaries cannot be had; the message is one line saying why."""


@dataclass(frozen=True)
class Tool:
    """One binary: which tools/ module builds it, from which package, and how."""

    name: str
    module_dir: str
    module: str
    package: str
    tags: tuple[str, ...] = ()


TOOLS_BUILT = (
    Tool("etcd", "etcd", "go.etcd.io/etcd/server/v3", "go.etcd.io/etcd/server/v3"),
    Tool("kwok", "kwok", "sigs.k8s.io/kwok", "sigs.k8s.io/kwok/cmd/kwok"),
    Tool(
        "kube-apiserver",
        "kube",
        "k8s.io/kubernetes",
        "k8s.io/kubernetes/cmd/kube-apiserver",
        KUBE_TAGS,
    ),
    Tool(
        "kube-controller-manager",
        "kube",
        "k8s.io/kubernetes",
        "k8s.io/kubernetes/cmd/kube-controller-manager",
        KUBE_TAGS,
    ),
    Tool(
        "kube-scheduler",
        "kube",
        "k8s.io/kubernetes",
        "k8s.io/kubernetes/cmd/kube-scheduler",
        KUBE_TAGS,
    ),
    # The real node's kubelet (scripts/realnode.py), static like the release's.
    Tool("kubelet", "kube", "k8s.io/kubernetes", "k8s.io/kubernetes/cmd/kubelet", KUBE_TAGS),
)
NAMES = tuple(tool.name for tool in TOOLS_BUILT)
# The kwok binary has no built-in Stages (kwokctl writes them into the config it
# hands kwok), so the cache carries kwokctl's defaults, taken from the pinned
# kwok module: nodes initialise and heartbeat with a Lease, pods go Running with
# IPs from their node's podCIDR, complete, and are deleted.
KWOK_STAGES = "kwok-stages.yaml"
KWOK_STAGE_FILES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)


@dataclass(frozen=True)
class Module:
    """A pinned module as `go list -m -json` reports it in its tools/ module."""

    path: str
    version: str
    time: str


def go_binary() -> str:
    """The go command, or a BuildError that says it is missing."""
    go = shutil.which("go")
    if go is None:
        raise BuildError("the go command is not on PATH: install Go 1.26 or newer")
    return go


def run_go(args: list[str], cwd: Path) -> str:
    """stdout of a quick go command (not a build), or a BuildError with its stderr."""
    done = subprocess.run(
        [go_binary(), *args], cwd=cwd, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise BuildError(f"go {' '.join(args)} in {cwd} failed: {last[0]}")
    return done.stdout


def pinned_module(tool: Tool) -> Module:
    """The version of tool.module that its tools/ module pins, with its release time."""
    info = json.loads(run_go(["list", "-m", "-json", tool.module], TOOLS / tool.module_dir))
    return Module(path=info["Path"], version=info["Version"], time=info.get("Time", ""))


def module_source(module: Module, module_dir: str) -> Path:
    """Where the module's source is in Go's module cache, downloading it if need be."""
    info = json.loads(
        run_go(["mod", "download", "-json", f"{module.path}@{module.version}"], TOOLS / module_dir)
    )
    if "Dir" not in info:
        raise BuildError(f"go mod download {module.path}@{module.version}: {info.get('Error')}")
    return Path(info["Dir"])


def kube_ldflags(module: Module) -> list[str]:
    """-X flags so `kube-apiserver --version` says the release, as hack/lib/version.sh does.

    The build date is the release's own time on the module proxy, not now, so a
    rebuild of the same pins is byte-for-byte the same binary.
    """
    found = RELEASE_RE.match(module.version)
    if not found:
        raise BuildError(f"k8s.io/kubernetes {module.version} is not a vX.Y.Z release")
    values = {
        "gitVersion": module.version,
        "gitMajor": found.group(1),
        "gitMinor": found.group(2),
        "buildDate": module.time,
    }
    return [
        f"-X {package}.{key}={value}"
        for package in KUBE_VERSION_PACKAGES
        for key, value in values.items()
        if value
    ]


def ldflags(tool: Tool, module: Module) -> str:
    """The whole -ldflags value for one tool: stripped, and version-stamped."""
    flags = ["-s", "-w"]
    if tool.module == "k8s.io/kubernetes":
        flags += kube_ldflags(module)
    elif tool.module == "sigs.k8s.io/kwok":
        # kwok's own releases (hack/releases.sh) stamp pkg/consts.Version; its
        # source default has no leading v, so neither does ours.
        flags.append(f"-X sigs.k8s.io/kwok/pkg/consts.Version={module.version.lstrip('v')}")
    elif tool.module == "go.etcd.io/etcd/server/v3":
        # etcd prints GitSHA in --version; the module proxy does not give us one.
        flags.append(f"-X go.etcd.io/etcd/api/v3/version.GitSHA=module-{module.version}")
    return " ".join(flags)


def go_version() -> str:
    """`go env GOVERSION` (go1.26.8): a different compiler builds different binaries."""
    return run_go(["env", "GOVERSION"], ROOT).strip()


def cache_key(modules: dict[str, Module], goversion: str) -> str:
    """The cache directory's name: every pinned version, then a digest of all inputs."""
    digest = hashlib.sha256()
    for part in (RECIPE, goversion, sys.platform, os.uname().machine):
        digest.update(part.encode() + b"\0")
    for module_dir in sorted({tool.module_dir for tool in TOOLS_BUILT}):
        for name in ("go.mod", "go.sum"):
            digest.update((TOOLS / module_dir / name).read_bytes() + b"\0")
    k8s = modules["k8s.io/kubernetes"].version
    etcd = modules["go.etcd.io/etcd/server/v3"].version
    kwok = modules["sigs.k8s.io/kwok"].version
    return f"k8s-{k8s}_etcd-{etcd}_kwok-{kwok}_{digest.hexdigest()[:12]}"


def cache_root(cache: Path | None) -> Path:
    """Where keyed binary directories live: --cache, $CAPWATCH_KUBE_CACHE, else XDG."""
    if cache is not None:
        return cache.expanduser().resolve()
    explicit = os.environ.get("CAPWATCH_KUBE_CACHE")
    if explicit:
        return Path(explicit).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser().resolve() / "capwatch" / "kube"


def complete(directory: Path) -> dict[str, Path] | None:
    """The binaries (and kwok's stages, as "kwok-stages") when all are there, else None."""
    paths = {name: directory / name for name in NAMES}
    stages = directory / KWOK_STAGES
    if stages.is_file() and all(
        path.is_file() and os.access(path, os.X_OK) for path in paths.values()
    ):
        return {**paths, "kwok-stages": stages}
    return None


def write_kwok_stages(kwok: Module, out: Path) -> None:
    """kwokctl's default Stages, from the pinned kwok module, as one multi-document file."""
    source = module_source(kwok, "kwok")
    documents = [(source / name).read_text(encoding="utf-8").strip() for name in KWOK_STAGE_FILES]
    header = f"# kwokctl's default stages, from sigs.k8s.io/kwok@{kwok.version}."
    (out / KWOK_STAGES).write_text(
        header + "\n" + "\n---\n".join(documents) + "\n", encoding="utf-8"
    )


@contextmanager
def locked(root: Path, key: str) -> Iterator[None]:
    """Hold an exclusive lock for key: a second run waits, then finds the cache filled."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / f".{key}.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def elapsed(seconds: float) -> str:
    """12m05s, for progress lines."""
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


def wait_with_heartbeat(process: subprocess.Popen[bytes], name: str, start: float) -> int:
    """process's exit status, printing the elapsed time every HEARTBEAT_S meanwhile."""
    while True:
        try:
            return process.wait(timeout=HEARTBEAT_S)
        except subprocess.TimeoutExpired:
            print(f"build_kube:   {name}: {elapsed(time.monotonic() - start)}", flush=True)


def build_one(tool: Tool, module: Module, out: Path) -> float:
    """go build one binary into out, printing progress; its wall time in seconds."""
    command = [
        go_binary(),
        "build",
        "-trimpath",
        f"-tags={','.join(tool.tags)}",
        f"-ldflags=all={ldflags(tool, module)}",
        "-o",
        str(out / tool.name),
        tool.package,
    ]
    # Static binaries, like Kubernetes' own releases of these commands.
    env = {**os.environ, "CGO_ENABLED": "0"}
    print(f"build_kube: building {tool.name} ({tool.package}@{module.version})", flush=True)
    start = time.monotonic()
    process = subprocess.Popen(command, cwd=TOOLS / tool.module_dir, env=env)
    try:
        code = wait_with_heartbeat(process, tool.name, start)
    finally:
        # Interrupted (Ctrl-C, SIGTERM): the go command must not build on unseen.
        if process.poll() is None:
            process.terminate()
            process.wait()
    took = time.monotonic() - start
    if code != 0:
        raise BuildError(f"go build of {tool.name} failed (exit {code}); go's errors are above")
    print(f"build_kube: built {tool.name} in {elapsed(took)}", flush=True)
    return took


def build_all(modules: dict[str, Module], goversion: str, target: Path) -> None:
    """Build every binary into a temporary sibling of target, then rename it into place."""
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        timings = {
            tool.name: build_one(tool, modules[tool.module], staging) for tool in TOOLS_BUILT
        }
        manifest = {
            "go": goversion,
            "modules": {path: module.version for path, module in modules.items()},
            "build_seconds": {name: round(secs, 1) for name, secs in timings.items()},
            "bytes": {name: (staging / name).stat().st_size for name in NAMES},
        }
        write_kwok_stages(modules["sigs.k8s.io/kwok"], staging)
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        staging.chmod(0o755)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def cache_dir(cache: Path | None = None) -> Path:
    """The directory that holds (or will hold) the binaries for the pinned versions."""
    modules = {tool.module: pinned_module(tool) for tool in TOOLS_BUILT}
    return cache_root(cache) / cache_key(modules, go_version())


def cached_binaries(cache: Path | None = None) -> dict[str, Path] | None:
    """The binaries when they are already built, else None: never builds.

    For callers that cannot wait a cold build out (a test under a per-test
    timeout); raises BuildError when Go is missing, since the key needs it.
    """
    return complete(cache_dir(cache))


def ensure_binaries(cache: Path | None = None) -> dict[str, Path]:
    """Paths of kube-apiserver, kube-controller-manager, kube-scheduler, etcd and kwok.

    Builds them first when the cache has no complete directory for the pinned
    versions; raises BuildError (one line) when Go is missing or a build fails.
    """
    modules = {tool.module: pinned_module(tool) for tool in TOOLS_BUILT}
    goversion = go_version()
    key = cache_key(modules, goversion)
    root = cache_root(cache)
    target = root / key
    found = complete(target)
    if found is not None:
        print(f"build_kube: cached: {target}", flush=True)
        return found
    with locked(root, key):
        found = complete(target)
        if found is not None:
            print(f"build_kube: cached (built by another run): {target}", flush=True)
            return found
        for stale in root.glob(f".{key}.*"):
            # Staging directories of a run that was killed outright; we hold the lock.
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
        if target.exists():
            # build_all only renames complete directories into place, so this one
            # was damaged afterwards (a binary deleted): rebuild it whole.
            shutil.rmtree(target)
        start = time.monotonic()
        build_all(modules, goversion, target)
        print(f"build_kube: all built in {elapsed(time.monotonic() - start)}: {target}")
    built = complete(target)
    if built is None:
        raise BuildError(f"{target} lacks a binary after the build")
    return built


def interrupted(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--cache", type=Path, default=None, help="cache root (default: see module docstring)"
    )
    args = parser.parse_args(argv)
    # A CI timeout or `kill` sends SIGTERM: unwind as for Ctrl-C, so the go build
    # is stopped and the staging directory removed.
    signal.signal(signal.SIGTERM, interrupted)
    try:
        paths = ensure_binaries(args.cache)
    except BuildError as err:
        print(f"build_kube: {err}", file=sys.stderr)
        return 1
    except OSError as err:
        print(f"build_kube: {err.strerror}: {err.filename}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("build_kube: interrupted; nothing was cached", file=sys.stderr)
        return 130
    print(paths["kube-apiserver"].parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
