"""The reconcile cycle's floor: the agent's views with nothing behind them.

bench/scenarios/cycle.py times the same cycle twice, with the real list+watch pod and
claims views and with these in memory: the claims as one snapshot built once, the pods as
the tests' static view (bench.rigs.node.memory_pods), so the ratio is what the watch
caches cost a cycle.
"""

from __future__ import annotations

from capwatch.agent.dra.claims import ClaimsSnapshot
from capwatch.agent.pods import PodSnapshot


class FixedClaims:
    """A claims view of one snapshot, built once, in memory."""

    def __init__(self, snapshot: ClaimsSnapshot) -> None:
        self._snapshot = snapshot

    def snapshot(self, pods: PodSnapshot) -> ClaimsSnapshot:
        return self._snapshot

    def close(self) -> None:
        return
