"""Human-readable text for the cluster stream (``capwatch watch --cluster``): a nodes table.

One row per node of the controller's shard: its ``GPUPowerCapEnforced``
condition (status, reason, message), the controller's link to its agent, its
GPUs healthy of total, and the age of its latest cycle. Lines are
:mod:`capwatch.watch.tables` segments: a terminal colours them (False red, Unknown
yellow), plain output drops the styles. The columns each width shows are
chosen by rank, not by what the cells hold, so nothing moves when a node
fails; NODE is as wide as the longest name seen (so far; at most 28 on a
terminal, where a longer name loses its middle), and the message takes the
width left and is cut with an ellipsis (with no width, a pipe without
``COLUMNS``, it is whole). Nodes are in natural order: ``sim-node-2`` before
``sim-node-10``.

The age is the one the controller measured when it sent the node, plus the
time since that message arrived. The controller sends a node again only when
its condition, agent link or GPUs change, not for every cycle, so on a
steady node the age counts from its last change; a node whose agent stops
cycling turns ``CycleStale`` (an update) within its staleness bound.

:class:`NodeBoard` keeps what a screen shows: every node as last reported
(redrawn in place on a terminal), what each message changed (a line per
changed node, all that is printed elsewhere), and the table again at a later
time (its ages counted on, for a watch whose stream was lost).
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace

from google.protobuf.timestamp_pb2 import Timestamp

from capwatch.api.gen.capwatch.v1 import cluster_health_pb2 as cpb
from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.watch.layout import FAILED, GOOD, HEADER, QUIET, Column, Line, Style, fit, flow, table
from capwatch.watch.tables import Frame

UNKNOWN = "yellow"

NODE_COLUMNS = (
    Column(name="NODE", min=18, max=28, grow=2, floor=10),
    Column(name="STATUS", min=7, max=7),
    Column(name="REASON", min=17, max=22, grow=1, floor=12),
    Column(name="AGENT", min=11, max=11, rank=3),
    Column(name="GPUS", min=5, max=5, rank=1),
    Column(name="AGE", min=5, max=5, rank=2),
    # Up to the condition's own bound (1,024 characters): whole where there is no width.
    Column(name="MESSAGE", min=16, max=1024, floor=8),
)
_STATUS = {
    cpb.CONDITION_STATUS_TRUE: "True",
    cpb.CONDITION_STATUS_FALSE: "False",
    cpb.CONDITION_STATUS_UNKNOWN: "Unknown",
}
_STATUS_STYLE = {"True": GOOD, "False": FAILED, "Unknown": UNKNOWN}
_LINK = {
    cpb.AGENT_LINK_MISSING: "missing",
    cpb.AGENT_LINK_CONNECTING: "connecting",
    cpb.AGENT_LINK_CONNECTED: "connected",
    cpb.AGENT_LINK_UNREACHABLE: "unreachable",
}
_LINK_STYLE = {"missing": UNKNOWN, "connecting": QUIET, "unreachable": UNKNOWN}
_REMOVED_CELLS = ("-", "(removed)", "-", "-", "-", "left this shard's view")


def status_of(node: cpb.NodeHealth) -> str:
    """``True``, ``False``, ``Unknown``; ``-`` unset; a number from a newer controller."""
    value = node.condition.status
    return _STATUS.get(value, "-" if value == cpb.CONDITION_STATUS_UNSPECIFIED else str(value))


def age_text(seconds: float | None) -> str:
    """``0.4s``, ``12s``, ``5m``, ``3h``, ``2d`` (at most 5 characters); ``-`` for none."""
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:.1f}s" if seconds < 10 else f"{int(seconds)}s"


def gpus_text(node: cpb.NodeHealth) -> str:
    """Healthy of total (``7/8``); ``-`` while no report has named a GPU."""
    if not node.gpus:
        return "-"
    healthy = sum(1 for g in node.gpus if g.health == pb.DEVICE_HEALTH_HEALTHY)
    return f"{healthy}/{len(node.gpus)}"


def node_cells(node: cpb.NodeHealth, age_s: float | None) -> tuple[str, ...]:
    link = _LINK.get(node.agent_link, "-" if node.agent_link == 0 else str(node.agent_link))
    return (
        node.node_name,
        status_of(node),
        node.condition.reason or "-",
        link,
        gpus_text(node),
        age_text(age_s),
        node.condition.message or "-",
    )


def node_styles(node: cpb.NodeHealth) -> tuple[Style, ...]:
    status = status_of(node)
    style = _STATUS_STYLE.get(status, "")
    alarm = "" if style == GOOD else style  # the reason and message of a failing node
    healthy, total = gpus_text(node).partition("/")[::2]
    gpus = FAILED if total and healthy != total else ""
    link = _LINK_STYLE.get(_LINK.get(node.agent_link, ""), "")
    return ("", style, alarm, link, gpus, "", alarm)


_Row = tuple[tuple[str, ...], tuple[Style, ...]]


def node_table(
    rows: Iterable[_Row],
    width: int | None,
    *,
    longest: int = 0,
) -> list[Line]:
    """A header and a row per node. NODE is as wide as the ``longest`` name seen (so
    far: a later, longer one widens it from then on; 0: not known, NODE_COLUMNS' own
    width), the rest going to the message. Fitted to ``width``, a name too long for
    its column loses its middle; with no width, names are whole."""
    columns = NODE_COLUMNS
    if longest:
        columns = (node_column(longest, width), *NODE_COLUMNS[1:])
    room = fit(columns, width)[0]
    named = [((middle_cut(cells[0], room), *cells[1:]), styles) for cells, styles in rows]
    return table(columns, named, width)


def node_column(longest: int, width: int | None) -> Column:
    """NODE sized to the longest name: that wide, on a terminal at most its usual
    widest (and no wider than its usual narrowest when even that does not fit)."""
    base = NODE_COLUMNS[0]
    size = max(len(base.name), longest)
    if width is None:
        return replace(base, min=size, max=size)
    return replace(
        base, min=min(base.min, size), max=min(base.max, size), floor=min(base.floor, size)
    )


@functools.lru_cache(maxsize=1 << 16)
def natural_key(name: str) -> tuple[tuple[object, ...], str]:
    """Sorts ``sim-node-2`` before ``sim-node-10``: each run of digits as its number."""
    parts = re.split(r"(\d+)", name)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), name


def middle_cut(text: str, width: int | None) -> str:
    """``text`` in ``width`` characters, its middle replaced by an ellipsis: node names
    that share a prefix (a pool's) differ at the end."""
    if width is None or len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head) :]


@dataclass(frozen=True, kw_only=True)
class _Seen:
    node: cpb.NodeHealth
    received_at: float  # the client's monotonic clock when the message arrived

    def age(self, now: float) -> float | None:
        if not self.node.HasField("last_cycle_age"):
            return None
        reported = self.node.last_cycle_age.ToTimedelta().total_seconds()
        return reported + max(0.0, now - self.received_at)

    def row(self, now: float) -> _Row:
        return node_cells(self.node, self.age(now)), node_styles(self.node)


class NodeBoard:
    """The nodes of one controller's shard, from a snapshot and the updates after it."""

    def __init__(self, *, blocks: bool = True) -> None:
        """``blocks``: build each frame's block (a screen redraws it); else a snapshot's
        alone, which is printed whole."""
        self._blocks = blocks
        self._nodes: dict[str, _Seen] = {}
        self._longest = 0  # the longest node name seen
        self._instance = ""
        self._shard = cpb.Shard()
        self._sequence = 0
        self._resync = False
        self._status: list[Line] = []

    def snapshot(self, snapshot: cpb.ClusterSnapshot, now: float, width: int | None) -> Frame:
        """Every node replaced; ``now``: when it arrived (the client's monotonic clock)."""
        self._nodes = {n.node_name: _Seen(node=n, received_at=now) for n in snapshot.nodes}
        self._longest = max([self._longest, *map(len, self._nodes)])
        self._instance, self._shard = snapshot.controller_instance_id, snapshot.shard
        self._sequence, self._resync = snapshot.sequence, snapshot.resync
        self._status = []
        block = self._picture(now, width)
        return Frame(block=block, changes=(*block, ()))

    def update(self, update: cpb.NodeUpdate, now: float, width: int | None) -> Frame:
        """One node changed or left: its line, and a note when its condition moved."""
        name = update.node.node_name
        before = self._nodes.get(name)
        self._longest = max(self._longest, len(name))
        self._sequence = update.sequence
        self._status = []
        if update.removed:
            self._nodes.pop(name, None)
            row = ((name, *_REMOVED_CELLS), (QUIET,) * len(NODE_COLUMNS))
            note: Line = ((f"update {update.sequence}  {name} left this shard's view", QUIET),)
            return Frame(
                block=self._block(now, width),
                changes=tuple(self._table([row], width)[1:]),
                notes=(note,) if before is not None else (),
            )
        seen = self._nodes[name] = _Seen(node=update.node, received_at=now)
        notes: tuple[Line, ...] = ()
        if before is None or _condition_key(before.node) != _condition_key(update.node):
            notes = (self._transition(update.sequence, before, update.node),)
        # A change the table does not show (a GPU's message, the agent's address)
        # prints nothing: the same line again would only be noise.
        shown = before is None or _shown(before.node) != _shown(update.node)
        return Frame(
            block=self._block(now, width),
            changes=tuple(self._table([seen.row(now)], width)[1:]) if shown else (),
            notes=notes,
        )

    def heartbeat(self, heartbeat: cpb.ClusterHeartbeat, now: float, width: int | None) -> Frame:
        """The controller is alive: its line under the table; the heading again where
        it changed (the shard's leader moved)."""
        moved = _shard_key(heartbeat.shard) != _shard_key(self._shard)
        self._shard = heartbeat.shard
        self._status = flow(
            [
                (("heartbeat", HEADER), (f"  {_clock(heartbeat.time)}", "")),
                ((f"update {heartbeat.last_sequence}", ""),),
            ],
            width,
        )
        block = self._block(now, width)
        return Frame(block=block, changes=tuple(self._heading(width)) if moved else ())

    def block_at(self, now: float, width: int | None) -> tuple[Line, ...]:
        """The table as of ``now`` (the clock of the messages' ``now``): every node as
        last received, its age counted on since."""
        return self._picture(now, width)

    def _block(self, now: float, width: int | None) -> tuple[Line, ...]:
        return self._picture(now, width) if self._blocks else ()

    def _picture(self, now: float, width: int | None) -> tuple[Line, ...]:
        rows = [self._nodes[name].row(now) for name in sorted(self._nodes, key=natural_key)]
        return (*self._heading(width), *self._table(rows, width), *self._status)

    def _table(self, rows: list[_Row], width: int | None) -> list[Line]:
        return node_table(rows, width, longest=self._longest)

    def _heading(self, width: int | None) -> list[Line]:
        shard = self._shard
        parts: list[Line] = [
            ((f"cluster{' (resync)' if self._resync else ''}", HEADER),),
            ((f"controller {self._instance or '?'}", ""),),
        ]
        if shard.count:
            role = "leader" if shard.leading else "standby"
            if not shard.leading and shard.holder:
                role += f" (leader {shard.holder})"
            parts.append(((f"shard {shard.index}/{shard.count} {role}", ""),))
        parts.append(((f"update {self._sequence}", ""),))
        parts.append(self._counts())
        return flow(parts, width)

    def _counts(self) -> Line:
        statuses = [status_of(seen.node) for seen in self._nodes.values()]
        line: list[tuple[str, Style]] = [(f"{len(statuses)} nodes", "")]
        for status, style in _STATUS_STYLE.items():
            if count := statuses.count(status):
                line += [(", " if len(line) > 1 else ": ", ""), (f"{count} {status}", style)]
        return tuple(line)

    @staticmethod
    def _transition(sequence: int, before: _Seen | None, node: cpb.NodeHealth) -> Line:
        status = status_of(node)
        moved = status if before is None else f"{status_of(before.node)} → {status}"
        message = f": {node.condition.message}" if node.condition.message else ""
        return (
            (f"update {sequence}  {node.node_name}  ", ""),
            (f"{moved} {node.condition.reason}{message}", _STATUS_STYLE.get(status, "")),
        )


def _shown(node: cpb.NodeHealth) -> tuple[str, ...]:
    """What a row shows, its age aside (that moves on its own)."""
    cells = node_cells(node, None)
    return cells[:5] + cells[6:]


def _condition_key(node: cpb.NodeHealth) -> tuple[int, str]:
    return node.condition.status, node.condition.reason


def _shard_key(shard: cpb.Shard) -> tuple[object, ...]:
    return shard.index, shard.count, shard.leading, shard.holder


def _clock(stamp: Timestamp) -> str:
    if stamp.seconds == 0 and stamp.nanos == 0:
        return "--:--:--"
    return time.strftime("%H:%M:%S", time.localtime(stamp.seconds))
