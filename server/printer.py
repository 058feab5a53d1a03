"""What ``capwatch watch`` prints: a live table, only what changed, or JSON lines.

On a terminal the agent's GPUs (or the kubelet's device list) are one table
redrawn in place, with verdict changes, disconnects and resyncs scrolling
above it. Elsewhere each message prints only what it changed: the snapshot
whole, then a cycle's heading and the rows that differ, a heartbeat when
readiness moved. ``--json`` prints every message as one JSON object per line,
with status lines on stderr so stdout stays pure.
"""

from __future__ import annotations

from typing import Any, TextIO

from google.protobuf.json_format import MessageToJson

from server.events import Cycle, DeviceList, Disconnected, Heartbeat, Snapshot
from server.gen.capwatch.v1 import node_health_pb2 as pb
from server.screen import Screen, screen_for
from server.tables import DeviceBoard, Frame, GpuBoard, Line

Message = Snapshot | Cycle | Heartbeat | DeviceList


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
        self._lost = False
        self._sequence = since  # the last cycle shown (or asked to resume after)

    def message(self, event: Message) -> None:
        if self._lost:
            self._lost = False
            self._status(f"reconnected to {self._target}")
        if isinstance(event, Snapshot) and event.resync:
            self._status(f"resync: {self._resync_cause(event)}; showing its current state")
        if isinstance(event, Snapshot):
            self._sequence = event.snapshot.sequence
        elif isinstance(event, Cycle):
            self._sequence = event.cycle.sequence
        if self._screen is None:
            self._write(self._out, as_json(_message(event)))
            return
        self._screen.show(self._frame(event, self._screen.width))

    def unreachable(self, event: Disconnected) -> None:
        """The agent could not be reached at all (and --retry was not given)."""
        self._error(f"cannot reach {self._target}: {event.error} (--retry keeps trying)")

    def refused(self, event: Disconnected) -> None:
        """The agent refused the request: retrying cannot help."""
        self._error(f"{self._target}: {event.error}")

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
        return self._devices.devices(event.response, event.version.value, width)

    def _resync_cause(self, event: Snapshot) -> str:
        if event.restarted:
            return "the agent restarted"
        if event.snapshot.sequence < self._sequence:
            # Only --since can be ahead: the agent's sequence never goes back.
            return (
                f"--since {self._sequence} is ahead of the agent's last cycle "
                f"({event.snapshot.sequence})"
            )
        return "the cycles missed are no longer buffered"

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


def _message(event: Message) -> Any:
    if isinstance(event, Snapshot):
        return pb.WatchResponse(snapshot=event.snapshot)
    if isinstance(event, Cycle):
        return pb.WatchResponse(cycle=event.cycle)
    if isinstance(event, Heartbeat):
        return pb.WatchResponse(heartbeat=event.heartbeat)
    return event.response
