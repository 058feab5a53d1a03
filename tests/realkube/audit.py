"""A control plane of a test module's own, with the API server's audit log on: what each
ServiceAccount called, and what the authorizer answered, as the server saw it.

The policy logs every request at ``Metadata`` level (user, verb, resource, namespace,
response code), once when a response starts (long-running watches) and once when it
completes. The log backend writes each event before the request returns (blocking
mode), so a test that has seen a component's 403 can read it from the file at once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.realkube.chart import Grant
from tests.realkube.controlplane import ControlPlane

POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
"""


@contextmanager
def audited_plane(
    directory: Path, binaries: dict[str, Path], *, extra_args: Iterable[str] = ()
) -> Iterator[ControlPlane]:
    """etcd and kube-apiserver under ``directory``, auditing to ``directory/audit.log``."""
    directory.mkdir(parents=True, exist_ok=True)
    policy = directory / "audit-policy.yaml"
    policy.write_text(POLICY, encoding="utf-8")
    args = [
        f"--audit-policy-file={policy}",
        f"--audit-log-path={directory / 'audit.log'}",
        "--audit-log-maxbackup=0",
        *extra_args,
    ]
    with ControlPlane(directory, binaries=binaries, apiserver_args=args).start() as plane:
        yield plane


@dataclass(frozen=True)
class Call:
    """One request, as the audit log has it."""

    audit_id: str
    user: str
    verb: str
    group: str
    resource: str  # with its subresource: "nodes/status"
    namespace: str
    name: str
    code: int
    message: str = ""  # the answer's Status message, for a refusal

    @property
    def needs(self) -> frozenset[str]:
        """The verbs this request is authorized for: its own, and ``create`` for a
        server-side apply that creates its object (the API server asks the authorizer
        for both; a refused create answers 403 "cannot create resource")."""
        if self.verb == "patch" and self.code == 201:
            return frozenset({"patch", "create"})
        if self.verb == "patch" and self.code == 403 and "cannot create resource" in self.message:
            return frozenset({"create"})
        return frozenset({self.verb})

    def covered_by(self, grant: Grant) -> bool:
        """Whether ``grant`` is the permission this request needs (or needed)."""
        return (
            grant.verb in self.needs
            and (self.group, self.resource) == (grant.group, grant.resource)
            and (grant.namespace is None or grant.namespace == self.namespace)
        )

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        return f"{self.verb} {self.resource}{where} -> {self.code}"


class AuditLog:
    """The audit log file of an :func:`audited_plane`, read from a mark on."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def mark(self) -> int:
        """Where the log ends now: calls(since=mark) are those made after this."""
        return self.path.stat().st_size if self.path.exists() else 0

    def calls(self, *, user: str, since: int = 0) -> list[Call]:
        """Every resource request of ``user`` after ``since``, once each (the latest stage
        seen: a watch still open reads as its start, 200)."""
        if not self.path.exists():
            return []
        with self.path.open("rb") as log:
            log.seek(since)
            lines = log.read().splitlines()
        by_id: dict[str, Call] = {}
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:  # the last line, half written
                continue
            ref = event.get("objectRef")
            if event.get("user", {}).get("username") != user or not ref:
                continue
            resource = ref.get("resource", "")
            if ref.get("subresource"):
                resource += "/" + ref["subresource"]
            by_id[event["auditID"]] = Call(
                audit_id=event["auditID"],
                user=user,
                verb=event["verb"],
                group=ref.get("apiGroup", ""),
                resource=resource,
                namespace=ref.get("namespace", ""),
                name=ref.get("name", ""),
                code=int(event.get("responseStatus", {}).get("code", 0)),
                message=str(event.get("responseStatus", {}).get("message", "")),
            )
        return list(by_id.values())
