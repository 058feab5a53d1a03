"""The real node's pod network: a bridge with no way out, and the API server's Service.

Pods get addresses from POD_SUBNET on a bridge of the node's own (the CNI
``bridge`` plugin with ``host-local`` addresses, both from Debian's
containernetworking-plugins). The bridge has no uplink, nothing is
masqueraded, IP forwarding stays as the host had it, and a FORWARD rule drops
whatever a pod would send anywhere but another pod: pod traffic never leaves
this machine. The kubelet reaches pods on the bridge (readiness probes, the
agent's gRPC port); pods reach the host only at the bridge's own address.

There is no kube-proxy. What it would do for the one Service capwatch uses, the
API server's ``kubernetes`` Service, is one DNAT rule: SERVICE_IP:443 to the
API server on 127.0.0.1, with ``route_localnet`` on the bridge so the kernel
lets pod traffic reach a loopback address. Pods keep the in-cluster
configuration the kubelet gives them (KUBERNETES_SERVICE_HOST=10.0.0.1), as in
a real cluster. Every rule lives in chains of our own, so ``down`` removes
exactly what ``up`` added.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from pathlib import Path

BRIDGE = "cwnode0"
POD_SUBNET = "10.213.7.0/24"
GATEWAY = "10.213.7.1"
# The `kubernetes` Service's ClusterIP: the first address of the control plane's
# --service-cluster-ip-range (tests/realkube/flags.py's SERVICE_CIDR, 10.0.0.0/24).
SERVICE_IP = "10.0.0.1"
NETWORK_NAME = "capwatch-realnode"
NAT_CHAIN = "CAPWATCH-REALNODE"
FILTER_CHAIN = "CAPWATCH-REALNODE-FWD"


class NetworkError(Exception):
    """The pod network could not be set up; one line."""


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise NetworkError(f"{' '.join(argv)}: {last}")
    return done


def overlapping_route() -> str | None:
    """A route of this host that overlaps POD_SUBNET (then up must refuse), or None."""
    subnet = ipaddress.ip_network(POD_SUBNET)
    for line in run("ip", "-4", "route", "show", "table", "all").stdout.splitlines():
        destination = line.split()[0] if line.split() else ""
        if destination in {"default", "broadcast", "local", "unreachable"}:
            continue
        try:
            network = ipaddress.ip_network(destination, strict=False)
        except ValueError:
            continue
        if network.prefixlen > 0 and network.overlaps(subnet) and BRIDGE not in line:
            return line.strip()
    return None


def cni_config(ipam_dir: Path) -> dict[str, object]:
    """The CNI network configuration list containerd's CRI plugin reads."""
    return {
        "cniVersion": "1.0.0",
        "name": NETWORK_NAME,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                # The bridge is made (with its address) by up, not by the plugin:
                # isGateway would also switch on the host's IP forwarding.
                "isGateway": False,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET, "gateway": GATEWAY}]],
                    "routes": [{"dst": "0.0.0.0/0", "gw": GATEWAY}],
                    "dataDir": str(ipam_dir),
                },
            }
        ],
    }


def write_cni_config(conf_dir: Path, ipam_dir: Path) -> Path:
    conf_dir.mkdir(parents=True, exist_ok=True)
    ipam_dir.mkdir(parents=True, exist_ok=True)
    path = conf_dir / "10-capwatch-realnode.conflist"
    path.write_text(json.dumps(cni_config(ipam_dir), indent=2) + "\n", encoding="utf-8")
    return path


def bridge_exists() -> bool:
    return run("ip", "link", "show", BRIDGE, check=False).returncode == 0


def create(apiserver_port: int) -> None:
    """The bridge with the gateway address, route_localnet, and our two chains."""
    if overlapping := overlapping_route():
        raise NetworkError(f"the pod subnet {POD_SUBNET} overlaps this host's route: {overlapping}")
    run("ip", "link", "add", BRIDGE, "type", "bridge")
    run("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
    run("ip", "link", "set", BRIDGE, "up")
    Path(f"/proc/sys/net/ipv4/conf/{BRIDGE}/route_localnet").write_text("1\n")
    run("iptables", "-t", "nat", "-N", NAT_CHAIN)
    run("iptables", "-t", "nat", "-I", "PREROUTING", "1", "-j", NAT_CHAIN)
    run(
        "iptables", "-t", "nat", "-A", NAT_CHAIN, "-s", POD_SUBNET, "-d", f"{SERVICE_IP}/32",
        "-p", "tcp", "--dport", "443", "-j", "DNAT", "--to-destination",
        f"127.0.0.1:{apiserver_port}",
    )  # fmt: skip
    run("iptables", "-t", "filter", "-N", FILTER_CHAIN)
    run("iptables", "-t", "filter", "-I", "FORWARD", "1", "-j", FILTER_CHAIN)
    # Pod to pod is bridged, not forwarded; anything else a pod sends stops here.
    run("iptables", "-t", "filter", "-A", FILTER_CHAIN, "-i", BRIDGE, "-j", "DROP")


def remove() -> list[str]:
    """Undo create (and anything the bridge plugin hung on the bridge); what failed."""
    failures: list[str] = []
    for table, parent, chain in (
        ("nat", "PREROUTING", NAT_CHAIN),
        ("filter", "FORWARD", FILTER_CHAIN),
    ):
        # -D until it fails: an interrupted up may have inserted the jump twice.
        while run("iptables", "-t", table, "-D", parent, "-j", chain, check=False).returncode == 0:
            pass
        run("iptables", "-t", table, "-F", chain, check=False)
        done = run("iptables", "-t", table, "-X", chain, check=False)
        if done.returncode != 0 and chain in run("iptables", "-t", table, "-S", check=False).stdout:
            failures.append(f"iptables chain {table}/{chain}: {done.stderr.strip()}")
    for link in veths():
        run("ip", "link", "delete", link, check=False)
    if bridge_exists():
        done = run("ip", "link", "delete", BRIDGE, check=False)
        if done.returncode != 0:
            failures.append(f"bridge {BRIDGE}: {done.stderr.strip()}")
    return failures


def veths() -> list[str]:
    """The host ends of pod interfaces still on the bridge."""
    done = run("ip", "-o", "link", "show", "master", BRIDGE, check=False)
    return [
        line.split(":")[1].strip().split("@")[0] for line in done.stdout.splitlines() if ":" in line
    ]


def leftovers() -> list[str]:
    """What of the network is still there: the bridge, its veths, our chains."""
    found = [f"network device {BRIDGE}"] if bridge_exists() else []
    found += [f"network device {link}" for link in veths()]
    for table, chain in (("nat", NAT_CHAIN), ("filter", FILTER_CHAIN)):
        if chain in run("iptables", "-t", table, "-S", check=False).stdout:
            found.append(f"iptables chain {table}/{chain}")
    return found
