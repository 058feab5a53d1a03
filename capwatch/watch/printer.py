"""What ``capwatch watch`` prints: a live table, only what changed, or JSON lines.

On a terminal the agent's GPUs (or the kubelet's device list, or with
``--cluster`` the controller's nodes) are one table redrawn in place, with
verdict (or condition) changes, disconnects and resyncs scrolling above it.
Elsewhere each message prints only what it changed: the snapshot whole, then
a cycle's heading and the rows that differ (a line per changed node), a
heartbeat when readiness (or the shard's leader) moved. ``--json`` prints
every message as one JSON object per line, with status lines on stderr so
stdout stays pure.
"""

from __future__ import annotations

from typing import Any, TextIO

from google.protobuf.json_format import MessageToJson

from api.gen.capwatch.v1 import cluster_health_pb2 as cpb
from api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.watch.cluster_table import NodeBoard
from capwatch.watch.layout import Line
from capwatch.watch.screen import Screen, screen_for
from capwatch.watch.tables import DeviceBoard, Frame, GpuBoard
from client.stream_events import (
    ClusterHeartbeat,
    ClusterSnapshot,
    Cycle,
    DeviceList,
    Disconnected,
    Heartbeat,
    NodeUpdate,
    Snapshot,
)

Message = (
    Snapshot | Cycle | Heartbeat | DeviceList | ClusterSnapshot | NodeUpdate | ClusterHeartbeat
)


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
        self._lost = False
        self._sequence = since  # the last cycle (or update) shown, or asked to resume after

    def message(self, event: Message) -> None:
        if self._lost:
            self._lost = False
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
        self._lost = True
        self._status(
            f"disconnected from {self._target}: {event.error}; retrying in {event.retry_in:.2f}s",
            style="yellow",
        )

    def close(self) -> None:
        if self._screen is not None:
            self._screen.close()

    def _frame(self, event: Message, width: int | None) -> Frame:
        if isinstance(event, Snapshot):
            return self._gpus.snapshot(event.snapshot, width)
        if isinstance(event, Cycle):
            return self._gpus.cycle(event.cycle, width)
        if isinstance(event, Heartbeat):
            return self._gpus.heartbeat(event.heartbeat, width)
        if isinstance(event, ClusterSnapshot):
            return self._nodes.snapshot(event.snapshot, event.received_at, width)
        if isinstance(event, NodeUpdate):
            return self._nodes.update(event.update, event.received_at, width)
        if isinstance(event, ClusterHeartbeat):
            return self._nodes.heartbeat(event.heartbeat, event.received_at, width)
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
