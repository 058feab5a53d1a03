"""The real node's kubelet: its configuration file and command line, as pure functions.

The kubelet is built from the same pinned k8s.io/kubernetes as the API server
(scripts/build_kube.py). What it is told, and why, where it differs from a
kubeadm node:

- ``failCgroupV1: false``: this host has hybrid cgroups (v1 controllers). Kubelet
  1.35+ refuses cgroup v1 unless told; v1 is on its way out of Kubernetes
  (docs/realnode.md).
- ``cgroupDriver: cgroupfs``: no systemd here.
- every directory under the node's own: ``--root-dir`` (never /var/lib/kubelet),
  ``podLogsDir`` (never /var/log/pods);
- the kubelet's API on the pod bridge's host address only, no read-only port; its client identity a
  certificate for ``system:node:<name>`` in ``system:nodes``, so the Node
  authorizer governs what it may read and write, as on any node;
- eviction thresholds and image garbage collection that a busy test machine
  cannot trip: the pods' images cannot be pulled again once removed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

NODE_LABELS = {"nvidia.com/gpu.present": "true"}


@dataclass(frozen=True, kw_only=True)
class KubeletPaths:
    """Everything of the kubelet's under the node's directory."""

    root_dir: Path
    pod_logs: Path
    config: Path
    kubeconfig: Path
    client_ca: Path

    @classmethod
    def under(cls, directory: Path, *, client_ca: Path) -> KubeletPaths:
        return cls(
            root_dir=directory / "kubelet",
            pod_logs=directory / "pod-logs",
            config=directory / "kubelet-config.yaml",
            kubeconfig=directory / "kubelet.kubeconfig",
            client_ca=client_ca,
        )


def configuration(
    paths: KubeletPaths, *, runtime_socket: Path, address: str, port: int, healthz_port: int
) -> dict[str, object]:
    """The KubeletConfiguration document."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": f"unix://{runtime_socket}",
        # The node's address on the pod bridge (its InternalIP): the API server reaches
        # the kubelet there for logs and exec; nothing outside this host can.
        "address": address,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(paths.client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        "podLogsDir": str(paths.pod_logs),
        "failSwapOn": False,
        "resolvConf": "/etc/resolv.conf",
        "maxPods": 20,
        # The default thresholds (10 % disk, 100 Mi memory) on a shared test machine
        # would evict the pods under test for reasons that are not theirs.
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # Status and pod sync a little faster than the defaults: tests wait on them.
        "nodeStatusUpdateFrequency": "4s",
        "syncFrequency": "10s",
        "serializeImagePulls": False,
    }


def write_configuration(paths: KubeletPaths, document: Mapping[str, object]) -> Path:
    paths.config.parent.mkdir(parents=True, exist_ok=True)
    paths.config.write_text(yaml.safe_dump(dict(document), sort_keys=False), encoding="utf-8")
    return paths.config


def argv(binary: Path, paths: KubeletPaths, *, node_name: str, node_ip: str) -> list[str]:
    """The kubelet's command line (what its config file cannot say)."""
    labels = ",".join(f"{key}={value}" for key, value in sorted(NODE_LABELS.items()))
    return [
        str(binary),
        f"--config={paths.config}",
        f"--kubeconfig={paths.kubeconfig}",
        f"--root-dir={paths.root_dir}",
        # Its self-signed serving pair; the default is /var/lib/kubelet/pki.
        f"--cert-dir={paths.root_dir / 'pki'}",
        f"--hostname-override={node_name}",
        f"--node-ip={node_ip}",
        f"--node-labels={labels}",
        "--v=1",
    ]
