"""What ``capwatch watch`` prints: a live table, only what changed, or JSON lines.

On a terminal the agent's GPUs (or the kubelet's device list, or with
``--cluster`` the controller's nodes) are one table redrawn in place, with
verdict (or condition) changes, disconnects and resyncs scrolling above it.
Elsewhere each message prints only what it changed: the snapshot whole, then
a cycle's heading and the rows that differ (a line per changed node), a
heartbeat when readiness (or the shard's leader) moved. ``--json`` prints
every message as one JSON object per line, with status lines on stderr so
stdout stays pure.

A lost stream is one short line (``disconnected: connection refused; retrying
in 0.2s``), printed again only when the reason changes, not on every retry.
On a terminal the picture stays, greyed, under a heading that says the stream
is lost and for how long, its ages counting on from what was last received
(:meth:`Printer.refresh` redraws it as time passes); elsewhere nothing is
printed again until a message comes.
"""

from __future__ import annotations

from typing import Any, Protocol, TextIO

import grpc
from google.protobuf.json_format import MessageToJson

from capwatch.api.gen.capwatch.v1 import cluster_health_pb2 as cpb
from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.client.stream_events import (
    ClusterHeartbeat,
    ClusterSnapshot,
    Cycle,
    DeviceList,
    Disconnected,
    Heartbeat,
    NodeUpdate,
    Snapshot,
)
from capwatch.watch.cluster_table import NodeBoard, age_text
from capwatch.watch.layout import FAILED, QUIET, Line, cut, flow, greyed
from capwatch.watch.screen import Screen, screen_for
from capwatch.watch.tables import DeviceBoard, Frame, GpuBoard

Message = (
    Snapshot | Cycle | Heartbeat | DeviceList | ClusterSnapshot | NodeUpdate | ClusterHeartbeat
)
LOST = "yellow"


class _Board(Protocol):
    def block_at(self, now: float, width: int | None) -> tuple[Line, ...]: ...


class Printer:
    """Every write is flushed at once; :meth:`close` leaves the last picture in place."""

    def __init__(
        self,
        *,
        target: str,
        json: bool,
        since: int,
        out: TextIO,
        err: TextIO,
        screen: Screen | None = None,
    ) -> None:
        self._target = target
        self._json = json
        self._out = out
        self._err = err
        self._screen = None if json else (screen or screen_for(out))
        self._gpus = GpuBoard()
        self._devices = DeviceBoard()
        # Thousands of nodes: build the whole table per update only to redraw it.
        self._nodes = NodeBoard(blocks=self._screen is not None and self._screen.redraws)
        self._board: _Board | None = None  # the one whose picture is on the screen
        self._lost_since: float | None = None  # when the stream was lost (None: it is not)
        self._reason = ""  # why, as the last disconnected line said
        self._closed = False
        self._sequence = since  # the last cycle (or update) shown, or asked to resume after

    @property
    def lost(self) -> bool:
        """Whether the stream is lost (since a disconnect, until the next message)."""
        return self._lost_since is not None

    def message(self, event: Message) -> None:
        if self._lost_since is not None:
            self._lost_since, self._reason = None, ""
            self._status(f"reconnected to {self._target}")
        if isinstance(event, Snapshot | ClusterSnapshot) and event.resync:
            self._status(f"resync: {self._resync_cause(event)}; showing its current state")
        if isinstance(event, Snapshot | ClusterSnapshot):
            self._sequence = event.snapshot.sequence
        elif isinstance(event, Cycle):
            self._sequence = event.cycle.sequence
        elif isinstance(event, NodeUpdate):
            self._sequence = event.update.sequence
        if self._screen is None:
            for message in _messages(event):
                self._write(self._out, as_json(message))
            return
        self._screen.show(self._frame(event, self._screen.width))

    def unreachable(self, event: Disconnected) -> None:
        """The agent could not be reached at all (and --retry was not given)."""
        self._error(f"cannot reach {self._target}: {event.error} (--retry keeps trying)")

    def refused(self, event: Disconnected, *, hint: str = "") -> None:
        """The server refused the request: retrying cannot help."""
        self._error(f"{self._target}: {event.error}" + (f" ({hint})" if hint else ""))

    def disconnected(self, event: Disconnected) -> None:
        """A line when the stream is lost, and again only when the reason changes; on a
        terminal the picture greyed under a heading saying so."""
        if self._lost_since is None:
            self._lost_since = event.received_at
        reason = disconnect_reason(event)
        if reason != self._reason:
            self._reason = reason
            self._status(
                f"disconnected: {reason}; retrying in {_seconds(event.retry_in)}", style=LOST
            )
        self.refresh(event.received_at)

    def refresh(self, now: float) -> None:
        """While the stream is lost, redraw the picture as of ``now`` (the clock of the
        events' ``received_at``): the time lost and the ages move on. Else nothing."""
        screen, board, since = self._screen, self._board, self._lost_since
        if self._closed or screen is None or not screen.redraws:
            return
        if board is None or since is None:
            return
        heading = flow(
            [
                (("DISCONNECTED", FAILED), (f" {age_text(max(0.0, now - since))}", FAILED)),
                ((f"{self._reason}; retrying", LOST),),
                (("below: the last state received", QUIET),),
            ],
            screen.width,
        )
        screen.show(Frame(block=(*heading, *greyed(board.block_at(now, screen.width)))))

    def close(self) -> None:
        self._closed = True
        if self._screen is not None:
            self._screen.close()

    def _frame(self, event: Message, width: int | None) -> Frame:
        at = event.received_at
        if isinstance(event, Snapshot | Cycle | Heartbeat):
            self._board = self._gpus
            if isinstance(event, Snapshot):
                return self._gpus.snapshot(event.snapshot, width, received_at=at)
            if isinstance(event, Cycle):
                return self._gpus.cycle(event.cycle, width, received_at=at)
            return self._gpus.heartbeat(event.heartbeat, width, received_at=at)
        if isinstance(event, ClusterSnapshot | NodeUpdate | ClusterHeartbeat):
            self._board = self._nodes
            if isinstance(event, ClusterSnapshot):
                return self._nodes.snapshot(event.snapshot, at, width)
            if isinstance(event, NodeUpdate):
                return self._nodes.update(event.update, at, width)
            return self._nodes.heartbeat(event.heartbeat, at, width)
        self._board = self._devices
        return self._devices.devices(event.response, event.version.value, width)

    def _resync_cause(self, event: Snapshot | ClusterSnapshot) -> str:
        peer, items, last = "agent", "cycles", "cycle"
        if isinstance(event, ClusterSnapshot):
            peer, items, last = "controller", "updates", "update"
        if event.restarted:
            return f"the {peer} restarted"
        if event.snapshot.sequence < self._sequence:
            # Only --since can be ahead: the server's sequence never goes back.
            return (
                f"--since {self._sequence} is ahead of the {peer}'s last {last} "
                f"({event.snapshot.sequence})"
            )
        return f"the {items} missed are no longer buffered"

    def _status(self, text: str, *, style: str = "") -> None:
        if self._screen is None:
            self._write(self._err, text)  # keep JSON output pure
        else:
            line: Line = ((text, style),)
            self._screen.note(line)

    def _error(self, text: str) -> None:
        self.close()  # a picture being redrawn must not overwrite the error
        self._write(self._err, f"capwatch watch: {text}")

    @staticmethod
    def _write(stream: TextIO, text: str) -> None:
        stream.write(text + "\n")
        stream.flush()


def disconnect_reason(event: Disconnected) -> str:
    """Why the stream was lost, in a few words (``connection refused``), from grpc's
    status text (``UNAVAILABLE: failed to connect to all addresses; last error: ...``)."""
    error = event.error
    if event.code is None:  # the client gave up on a silent stream
        return error.split(";")[0]
    if event.code is grpc.StatusCode.OK or error.startswith("stream ended by"):
        return error
    text = error.lower()
    for needles, reason in _REASONS:
        if any(needle in text for needle in needles):
            return reason
    if event.code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return "timed out"
    name, _, details = error.partition(": ")
    details = details.split("; ")[0]
    return cut(f"{name}: {details}" if details else name, 72)


# grpc's words for why a connection failed (its core's and the OS's), and ours for them.
_REASONS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("connection refused",), "connection refused"),
    (("no such file or directory",), "no socket there"),
    (("permission denied",), "permission denied"),
    (("domain name not found", "dns resolution failed", "errors resolving"), "name not resolved"),
    (("handshake", "ssl", "certificate"), "TLS handshake failed"),
    (("connection reset",), "connection reset"),
    (("network is unreachable",), "network unreachable"),
    (("no route to host",), "no route to host"),
    (("timed out", "timeout", "deadline exceeded"), "timed out"),
    (("socket closed", "broken pipe", "connection aborted", "goaway"), "connection closed"),
)


def _seconds(value: float) -> str:
    return f"{value:.1f}s" if value >= 0.1 else f"{value:.2f}s"


def as_json(message: Any) -> str:
    """One line of JSON with the proto field names grpcurl shows, zero values included
    (GPU 0's ``index``, ``ready: false``), so scripts need no defaults of their own."""
    return MessageToJson(
        message,
        indent=None,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )


def _messages(event: Message) -> list[Any]:
    """The messages ``event`` came in: a paged cluster snapshot's pages, as sent."""
    if isinstance(event, ClusterSnapshot) and event.pages:
        return [cpb.ClusterHealthServiceWatchResponse(snapshot=page) for page in event.pages]
    return [_message(event)]


def _message(event: Message) -> Any:
    if isinstance(event, Snapshot):
        return pb.WatchResponse(snapshot=event.snapshot)
    if isinstance(event, Cycle):
        return pb.WatchResponse(cycle=event.cycle)
    if isinstance(event, Heartbeat):
        return pb.WatchResponse(heartbeat=event.heartbeat)
    if isinstance(event, ClusterSnapshot):
        return cpb.ClusterHealthServiceWatchResponse(snapshot=event.snapshot)
    if isinstance(event, NodeUpdate):
        return cpb.ClusterHealthServiceWatchResponse(update=event.update)
    if isinstance(event, ClusterHeartbeat):
        return cpb.ClusterHealthServiceWatchResponse(heartbeat=event.heartbeat)
    return event.response
