"""Start or stop a real Kubernetes control plane on 127.0.0.1, for people.

    .venv/bin/python scripts/realkube.py up --dir /tmp/kube    # prints the kubeconfig path
    KUBECONFIG=/tmp/kube/kubeconfig kubectl get ns
    .venv/bin/python scripts/realkube.py down --dir /tmp/kube

``up`` builds the binaries first when scripts/build_kube.py's cache has none
(tens of minutes, once), starts etcd and kube-apiserver (and, with
--controllers / --kwok, kube-controller-manager, kube-scheduler and KWOK),
writes DIR/kubeconfig (admin) and DIR/state.json, and returns with them
running detached; their logs are in DIR/logs/. ``down`` stops what DIR's
state file names and returns once no process of it is left.

Errors (a busy port, a missing binary, a DIR that cannot be written) are one
line on stderr and exit status 1. Needs the project's virtualenv (cryptography,
PyYAML).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

try:
    from tests.realkube.controlplane import (
        ControlPlane,
        ControlPlaneError,
        build_kube,
        ensure_writable,
    )
    from tests.realkube.ports import PortError, Ports
except ImportError as missing:  # run with a python that lacks the project's dependencies
    print(
        f"realkube: {missing}: run it with the project's virtualenv "
        "(.venv/bin/python scripts/realkube.py)",
        file=sys.stderr,
    )
    sys.exit(1)


def fail(message: str) -> int:
    """Print the first line of message on stderr as the whole error; exit status 1."""
    print(f"realkube: {message.splitlines()[0] if message else 'failed'}", file=sys.stderr)
    return 1


def port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port")
    return value


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    commands = top.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start, write DIR/kubeconfig, leave it running")
    up.add_argument("--dir", type=Path, required=True, help="state, logs, kubeconfig")
    up.add_argument("--apiserver-port", type=port, help="default: a free port")
    up.add_argument("--etcd-port", type=port, help="default: a free port")
    up.add_argument(
        "--controllers",
        action="store_true",
        help="also kube-controller-manager (every controller) and kube-scheduler",
    )
    up.add_argument("--kwok", action="store_true", help="also KWOK, for fake nodes")
    up.add_argument("--cache", type=Path, help="scripts/build_kube.py's cache root")
    down = commands.add_parser("down", help="stop what `up --dir DIR` started")
    down.add_argument("--dir", type=Path, required=True)
    return top


def up(args: argparse.Namespace) -> int:
    directory = ensure_writable(args.dir)
    existing = None
    # No (readable) state file: nothing of ours is running there.
    with contextlib.suppress(ControlPlaneError):
        existing = ControlPlane.attach(directory)
    if existing is not None and existing.alive():
        pids = ", ".join(str(proc.pid) for proc in existing.alive())
        return fail(f"a control plane is already running in {directory} (pids {pids}): down first")
    # Bad ports are reported before a build that may take many minutes.
    Ports.free(args.apiserver_port, args.etcd_port)
    module = build_kube()
    try:
        binaries = module.ensure_binaries(args.cache)
    except module.BuildError as err:
        return fail(str(err))
    plane = ControlPlane(
        directory,
        binaries=binaries,
        apiserver_port=args.apiserver_port,
        etcd_port=args.etcd_port,
        tie_to_parent=False,
    )
    plane.start()
    try:
        if args.controllers:
            plane.start_controller_manager()
            plane.start_scheduler()
        if args.kwok:
            plane.start_kwok()
    except BaseException:
        plane.stop()
        raise
    print(f"kube-apiserver {plane.version()['gitVersion']} at {plane.url}")
    print(f"ready in {plane.startup_seconds:.1f}s; logs in {plane.logs}")
    print(f"export KUBECONFIG={plane.kubeconfig}")
    print(plane.kubeconfig)
    return 0


def down(args: argparse.Namespace) -> int:
    plane = ControlPlane.attach(args.dir)
    running = plane.alive()
    plane.stop()
    print(f"stopped {len(running)} process(es) in {args.dir}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return up(args) if args.command == "up" else down(args)
    except (ControlPlaneError, PortError) as err:
        return fail(str(err))
    except OSError as err:
        return fail(f"{err.filename or ''}: {err.strerror or err}")
    except KeyboardInterrupt:
        return fail("interrupted")


if __name__ == "__main__":
    sys.exit(main())
