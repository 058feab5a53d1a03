"""The real-node tests' workload: a pod running the static pause binary (images.py).

A GPU job stands in as a process in a pod's container; the fake NVML is told
that this process runs on a GPU, and the agent must find the pod from the
process's cgroup, as containerd and the kubelet really made it.
"""

from __future__ import annotations

from typing import Any

from tests.realnode.images import PAUSE_IMAGE

ANNOTATION = "capwatch.io/gpu-power-limit"


def workload_pod(name: str, *, watts: int | None) -> dict[str, Any]:
    """A pod asking for watts (annotation) on whatever GPU its process runs on."""
    metadata: dict[str, Any] = {"name": name}
    if watts is not None:
        metadata["annotations"] = {ANNOTATION: str(watts)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": PAUSE_IMAGE,
                    "imagePullPolicy": "Never",
                    "securityContext": {
                        "runAsNonRoot": True,
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }
