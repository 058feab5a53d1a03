"""Bring up a real Kubernetes node on this host, or take it down, for people.

    sudo .venv/bin/python scripts/realnode.py up --dir /tmp/node   # prints two paths
    KUBECONFIG=/tmp/node/kubeconfig build/tools/helm install capwatch charts/capwatch \\
        -n capwatch --create-namespace -f /tmp/node/values.yaml
    sudo .venv/bin/python scripts/realnode.py down --dir /tmp/node

``up`` builds what is missing first (the control plane and kubelet from the Go
module proxy, scripts/build_kube.py; the image, scripts/build_image.py; the
fake NVML, tests/fakenvml/build.py), then starts the control plane of
scripts/realkube.py (with the controller manager and scheduler), containerd
and runc from the OS packages, a CNI bridge, imports the pause image and
capwatch's image into containerd, starts a kubelet built from the same pinned
release, and returns once the Node is Ready, leaving it running. The last two
lines it prints are DIR/kubeconfig (admin) and DIR/values.yaml (the chart
values for this node). ``down`` stops all of it and removes every mount,
cgroup, network device, iptables chain and directory it made; it exits 1
naming anything it could not remove.

Runs as root; refuses with one line where it cannot run (not root, a missing
OS package, an unsupported cgroup layout, a node already up). Needs the
project's virtualenv (cryptography, PyYAML).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

try:
    from tests.fakenvml.build import build as build_fakenvml
    from tests.realkube.controlplane import ControlPlaneError, build_kube
    from tests.realnode.host import HostError, check
    from tests.realnode.node import NodeError, RealNode
    from tests.realnode.prerequisites import build_image
except ImportError as missing:  # run with a python that lacks the project's dependencies
    print(
        f"realnode: {missing}: run it with the project's virtualenv "
        "(.venv/bin/python scripts/realnode.py)",
        file=sys.stderr,
    )
    sys.exit(1)


def fail(message: str) -> int:
    """The first line of message on stderr, exit status 1."""
    print(f"realnode: {message.splitlines()[0] if message else 'failed'}", file=sys.stderr)
    return 1


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    commands = top.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start, write DIR/kubeconfig and DIR/values.yaml")
    up.add_argument("--dir", type=Path, required=True, help="state, logs, kubeconfig, values")
    up.add_argument("--image", type=Path, help="capwatch's OCI archive (default: make image's)")
    down = commands.add_parser("down", help="stop what `up --dir DIR` started, remove it all")
    down.add_argument("--dir", type=Path, required=True)
    return top


def up(args: argparse.Namespace) -> int:
    # Refusals first: a host that cannot run the node hears so before any build.
    check()
    module = build_kube()
    try:
        binaries = module.ensure_binaries()
    except module.BuildError as err:
        return fail(str(err))
    archive = args.image or build_image()
    fakenvml = build_fakenvml(ROOT / "build" / "fakenvml")
    node = RealNode(
        args.dir, binaries=binaries, image_archive=archive, fakenvml=fakenvml, tie_to_parent=False
    )
    node.up()
    print(f"node {node.node_name} Ready; image {node.image_reference}; logs in {node.logs}")
    print(f"export KUBECONFIG={node.kubeconfig}")
    print(node.kubeconfig)
    print(node.values_path)
    return 0


def down(args: argparse.Namespace) -> int:
    node = RealNode.attach(args.dir)
    node.down()
    print(f"node in {args.dir} stopped; nothing left on the host")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return up(args) if args.command == "up" else down(args)
    except (HostError, NodeError, ControlPlaneError) as err:
        return fail(str(err))
    except OSError as err:
        return fail(f"{err.filename or ''}: {err.strerror or err}")
    except KeyboardInterrupt:
        return fail("interrupted")


if __name__ == "__main__":
    sys.exit(main())
