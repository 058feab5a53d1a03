"""The command lines of etcd, kube-apiserver, kube-controller-manager, kube-scheduler
and KWOK, as pure functions: what each process is told, and why, in one place.

Everything binds 127.0.0.1. The CIDRs below are addresses inside API objects only
(Service ClusterIPs, node podCIDRs, fake pod IPs): nothing sends traffic to them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tests.realkube.pki import Pki

LOOPBACK = "127.0.0.1"
SERVICE_CIDR = "10.0.0.0/24"
CLUSTER_CIDR = "10.244.0.0/16"
# Pod IPs for KWOK nodes that have no podCIDR (kcm not allocating): apart from both above.
KWOK_DEFAULT_CIDR = "10.240.0.0/16"
# KWOK's documented convention for the nodes it fakes.
KWOK_NODE_SELECTOR = "kwok.x-k8s.io/node=fake"
ETCD_NAME = "capwatch"


def etcd_argv(binary: Path, data: Path, client_port: int, peer_port: int) -> list[str]:
    """A one-member etcd cluster on loopback."""
    client = f"http://{LOOPBACK}:{client_port}"
    peer = f"http://{LOOPBACK}:{peer_port}"
    return [
        str(binary),
        f"--name={ETCD_NAME}",
        f"--data-dir={data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster={ETCD_NAME}={peer}",
        # Test data need not survive a power cut; fsync on a shared CI disk costs
        # whole seconds of start-up and of every write.
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


def apiserver_argv(
    binary: Path,
    pki: Pki,
    *,
    etcd_port: int,
    port: int,
    disabled_admission: Sequence[str],
    extra: Sequence[str] = (),
) -> list[str]:
    """envtest's minimal flags (controller-runtime's pkg/internal/testing/controlplane),
    plus Node,RBAC authorization, a client CA, and a service-account issuer and keys."""
    url = f"https://{LOOPBACK}:{port}"
    argv = [
        str(binary),
        f"--etcd-servers=http://{LOOPBACK}:{etcd_port}",
        f"--bind-address={LOOPBACK}",
        f"--advertise-address={LOOPBACK}",
        f"--secure-port={port}",
        f"--cert-dir={pki.directory}",
        f"--tls-cert-file={pki.serving.cert}",
        f"--tls-private-key-file={pki.serving.key}",
        f"--client-ca-file={pki.ca.cert}",
        "--authorization-mode=Node,RBAC",
        # The TokenRequest API needs an issuer and a signing key; envtest uses
        # the server's own URL as the issuer.
        f"--service-account-issuer={url}",
        f"--service-account-key-file={pki.service_account_pub}",
        f"--service-account-signing-key-file={pki.service_account_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        # The `kubernetes` Service's endpoint would be the advertise address, and
        # loopback is no valid endpoint: keep the reconciler from retrying that.
        "--endpoint-reconciler-type=none",
    ]
    if disabled_admission:
        argv.append(f"--disable-admission-plugins={','.join(disabled_admission)}")
    argv.extend(extra)
    return argv


def serving_flags(pki: Pki, port: int) -> list[str]:
    """A component's secure port on loopback, with our serving certificate (SAN
    127.0.0.1) rather than a self-signed one, so health checks verify it."""
    return [
        f"--bind-address={LOOPBACK}",
        f"--secure-port={port}",
        f"--tls-cert-file={pki.serving.cert}",
        f"--tls-private-key-file={pki.serving.key}",
    ]


def delegated_auth(kubeconfig: Path) -> list[str]:
    """kube-controller-manager's and kube-scheduler's own API identity, also used to
    authenticate and authorize requests to their secure ports."""
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
    ]


def controller_manager_argv(
    binary: Path,
    pki: Pki,
    kubeconfig: Path,
    port: int,
    *,
    controllers: str,
    cluster_cidr: str | None,
    node_cidr_mask_size: int,
    extra: Sequence[str] = (),
) -> list[str]:
    """kube-controller-manager; with cluster_cidr it also gives every Node a podCIDR."""
    argv = [
        str(binary),
        *delegated_auth(kubeconfig),
        *serving_flags(pki, port),
        f"--controllers={controllers}",
        "--leader-elect=false",
        # Each controller acts as its own ServiceAccount, as in kubeadm clusters:
        # the bootstrap RBAC roles grant each just what it needs.
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki.service_account_key}",
        f"--root-ca-file={pki.ca.cert}",
        f"--cluster-signing-cert-file={pki.ca.cert}",
        f"--cluster-signing-key-file={pki.ca.key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
    ]
    if cluster_cidr is not None:
        argv += [
            "--allocate-node-cidrs=true",
            f"--cluster-cidr={cluster_cidr}",
            f"--node-cidr-mask-size={node_cidr_mask_size}",
        ]
    argv.extend(extra)
    return argv


def scheduler_argv(
    binary: Path, pki: Pki, kubeconfig: Path, port: int, extra: Sequence[str] = ()
) -> list[str]:
    return [
        str(binary),
        *delegated_auth(kubeconfig),
        *serving_flags(pki, port),
        "--leader-elect=false",
        *extra,
    ]


def kwok_argv(
    binary: Path,
    kubeconfig: Path,
    stages: Path,
    port: int,
    *,
    node_selector: str,
    node_ip: str,
    cidr: str,
    extra: Sequence[str] = (),
) -> list[str]:
    """KWOK for the nodes annotated with node_selector only (not every node)."""
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        # The kwok binary has no Stages built in (kwokctl supplies them), so the
        # cache's copy of kwokctl's defaults is its config.
        f"--config={stages}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={node_selector}",
        f"--node-ip={node_ip}",
        f"--cidr={cidr}",
        # As kwokctl runs it: with the heartbeat-with-lease Stage, a Lease per node.
        "--node-lease-duration-seconds=40",
        # Only for /healthz: plain HTTP on loopback.
        f"--server-address={LOOPBACK}:{port}",
        *extra,
    ]
