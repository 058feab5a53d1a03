"""What a scene runs on this machine: loopback addresses of a test's own, ``capwatch``
subprocesses with an environment each, and the pieces of a pod spec that become a
process's command line and environment off-cluster."""

from __future__ import annotations

import random
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.controller.e2e.processes import CAPWATCH, ROOT, Process, clean_environ


class Loopback:
    """Loopback addresses ``127.A.B.1``... of this test's own (A and B drawn at random, so
    engineers' runs on one machine do not meet), sharing one port free on the first: the
    port every agent pod's IP is dialled at, as DaemonSet pods share a containerPort."""

    def __init__(self) -> None:
        self._prefix = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}"
        with socket.socket() as probe:
            probe.bind((self.ip(1), 0))
            self.port = int(probe.getsockname()[1])

    def ip(self, n: int) -> str:
        return f"{self._prefix}.{n}"

    def address(self, n: int) -> str:
        return f"{self.ip(n)}:{self.port}"


def flag(args: Sequence[str], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(f"{name}=")]
    return value


def without_flags(args: Sequence[str], names: Sequence[str]) -> list[str]:
    return [a for a in args if a.split("=", 1)[0] not in names]


def downward_env(container: Mapping[str, Any], pod: Mapping[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet fills it in for ``pod`` (fieldRefs)."""
    metadata, spec = pod["metadata"], pod["spec"]
    fields = {
        "metadata.name": metadata["name"],
        "metadata.namespace": metadata["namespace"],
        "metadata.uid": metadata["uid"],
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
    }
    env = {}
    for var in container.get("env", []):
        if "valueFrom" in var:
            env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[var["name"]] = var.get("value", "")
    return env


class Processes:
    """Subprocesses of one test, each with an environment of its own; stopped (SIGTERM,
    then SIGKILL) by :meth:`close`."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._started: list[Process] = []

    def start(self, name: str, args: Sequence[str], env: Mapping[str, str] = {}) -> Process:
        out, err = self._directory / f"{name}.out", self._directory / f"{name}.err"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            popen = subprocess.Popen(
                [*CAPWATCH, *args],
                cwd=ROOT,
                env={**clean_environ(), **env},
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
            )
        process = Process(name=name, popen=popen, stdout=out, stderr=err)
        self._started.append(process)
        return process

    def close(self) -> None:
        running = [p for p in self._started if p.popen.poll() is None]
        for process in running:
            process.popen.terminate()
        for process in running:
            try:
                process.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait(timeout=10)
