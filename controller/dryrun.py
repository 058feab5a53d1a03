"""``--dry-run``: the Kubernetes writes the controller would make, printed instead.

One line per condition patch, per Event and per DeviceTaintRule write, on standard
output::

    PATCH nodes/gpu-7/status GPUPowerCapEnforced=False reason=CapWriteFailed message="gpu1 ..."
    EVENT Warning node/gpu-7 CapWriteFailed: gpu1 (GPU-...): write_failed: ...
    CREATE devicetaintrules/capwatch-gpu-7-gpu-1-3f2a... {...} capwatch.io/gpu-fault=xid:None

With no API server there is no Lease: the replica behaves as the leader of its
shard (its fence never closes) and everything else -- discovery from
``--targets``, the streams, the cluster stream -- runs as usual.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any, TextIO

from capwatch.controller.conditions import CONDITION_TYPE, NodeCondition
from capwatch.controller.objects import FieldOwner
from capwatch.controller.writes.recorder import NodeEvent


class PrintingApi:
    """A ConditionApi and EventApi that prints what it is asked to write."""

    def __init__(self, out: TextIO | None = None) -> None:
        self._out = out or sys.stdout

    async def apply_condition(
        self, node: str, condition: NodeCondition, *, deadline: float, force: bool = False
    ) -> int | None:
        print(
            f"PATCH nodes/{node}/status {CONDITION_TYPE}={condition.status.value} "
            f"reason={condition.reason} message={json.dumps(condition.message)}",
            file=self._out,
            flush=True,
        )
        return None

    async def condition_owners(self, node: str, *, deadline: float) -> tuple[FieldOwner, ...]:
        return ()  # nothing is applied, so no one else owns anything

    async def create_event(self, event: NodeEvent, *, deadline: float) -> None:
        print(
            f"EVENT {event.type.value} node/{event.node} {event.reason}: {event.message}",
            file=self._out,
            flush=True,
        )

    async def list_taint_rules(
        self, *, label_selector: str, deadline_s: float
    ) -> list[dict[str, Any]]:
        return []  # no API server: none is in place

    async def apply_taint_rule(
        self, name: str, body: dict[str, Any], *, deadline: float
    ) -> dict[str, Any]:
        spec = body["spec"]
        print(
            f"APPLY devicetaintrules/{name} "
            f"{json.dumps(spec['deviceSelector'], sort_keys=True)} "
            f"{spec['taint']['key']}={spec['taint']['value']}:{spec['taint']['effect']}",
            file=self._out,
            flush=True,
        )
        return body

    async def delete_taint_rule(self, name: str, *, deadline: float) -> None:
        print(f"DELETE devicetaintrules/{name}", file=self._out, flush=True)


class Unfenced:
    """The fence of a replica with no Lease to hold: it may always write (dry run)."""

    leading = True
    holder = ""

    def write_deadline(self) -> float:
        return math.inf  # each write is still bounded by its request timeout

    def lost(self, why: str) -> None:
        return  # nothing refuses a dry run
