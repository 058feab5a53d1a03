"""Whether capwatch is leaving this node, asked as the agent stops.

An agent that stops does not restore the default limits unless capwatch is
being removed from the node: a rollout, a crash, an OOM kill or a deleted pod
is followed by the DaemonSet's next pod, which adopts the caps from the
ownership record, so restoring on the way down would only open an uncapped
window between the two. Leaving means one of (docs/upgrades.md):

* the agent's DaemonSet is gone or being deleted (``helm uninstall``);
* the DaemonSet no longer runs on this node (its nodeSelector or required node
  affinity no longer matches the node's labels, or the node carries a NoExecute
  taint the pods do not tolerate), or the node itself is gone or being deleted;
* the agent's credentials are refused (HTTP 401 or 403): the release's service
  account or its binding is already deleted, which happens only at uninstall;
* the agent is not run by a DaemonSet at all (no pod name: by hand, the demo).

Anything else keeps the caps, an API server that cannot be asked included: a
cap left in place after an uninstall is the cap its pod asked for, and the next
capwatch on the node releases it; a default restored under a running job is
the uncapped window this exists to prevent. The Kubernetes reads are
:mod:`capwatch.agent.kube.departure`'s, its rules :mod:`capwatch.agent.kube.selection`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, kw_only=True)
class Departure:
    """The answer, in words for the log: leaving restores the defaults, staying keeps the caps."""

    leaving: bool
    reason: str


class DepartureCheck(Protocol):
    def check(self) -> Departure:
        """Ask once; never raises (what could not be told is an answer too)."""
        ...


class Standalone:
    """An agent no DaemonSet runs: nothing will adopt its caps, so it always leaves."""

    def check(self) -> Departure:
        return Departure(
            leaving=True, reason="not run by a DaemonSet (no pod name): nothing adopts the caps"
        )


def staying_unknown(why: str) -> Departure:
    return Departure(
        leaving=False,
        reason=f"cannot tell whether capwatch is leaving the node ({why}): caps left in place",
    )
