"""The pod view: which pods run on this node, and their annotations.

Two implementations: ``kube.informer`` (list+watch against the API server)
and ``agent.sim.world`` (the scenario file). The loop asks for a
:class:`PodSnapshot` once per cycle; a view that is not synced raises
:class:`~capwatch.kit.errors.PodViewError` and the cycle aborts before touching a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, kw_only=True, order=True)
class PodRef:
    """Identifies a pod. ``uid`` is what process attribution yields."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, kw_only=True)
class PodInfo:
    """What the agent needs to know about one pod."""

    ref: PodRef
    annotations: Mapping[str, str] = field(default_factory=dict)
    # The ResourceClaims (in the pod's namespace) it uses, by name: those its spec
    # names and those made for it from templates (its status names them).
    claims: tuple[str, ...] = ()
    # Succeeded or Failed: its processes are gone.
    finished: bool = False


@dataclass(frozen=True, kw_only=True)
class PodSnapshot:
    """The pods on this node at one moment, keyed by pod UID."""

    pods: Mapping[str, PodInfo]
    resource_version: str = ""

    def get(self, uid: str) -> PodInfo | None:
        return self.pods.get(uid)


class PodView(Protocol):
    def snapshot(self) -> PodSnapshot:
        """The current pods on this node. Raises PodViewError when not synced."""
        ...

    def close(self) -> None:
        """Stop any background work. Idempotent."""
        ...
