"""The hub's cycles as Watch sends them, on a :class:`~capwatch.kit.broadcast.Broadcast`.

A feeder on the event loop takes each report the hub records and publishes
it into the broadcast as a :class:`SharedCycle`, with the device table right
after it (so a cycle sent late, in a batch or a resume, keeps its own
transition times), encoded there and then: once per cycle, whatever the
number of subscribers. Every unfiltered stream then sends the cycle's one
message, the same bytes object, as a bare broadcast would.

Only the readiness is left to send time. Its ages (``last_cycle_age``,
``last_good_cycle_age``) are aged further by consumers with their own clocks
from the moment they receive the message (the shim: reported age + its own
monotonic time since receipt), so a message must never report an age younger
than the truth when it is sent. The readiness is encoded for a window of
:data:`AGE_WINDOW_S`, as of the window's *end*, and every cycle sent within
the window carries it: a send reports its ages at most that much too old,
never too young. A send after the window (a slow stream, a resume) opens a
new one. So a fan-out that takes 50 ms to reach every stream encodes the
readiness about five times, not once per stream.

Streams with a device filter encode their own cycles at send time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from capwatch.agent.devices import DeviceState
from capwatch.agent.reports import CycleReport
from capwatch.kit.broadcast import Broadcast
from capwatch.kit.readiness import Readiness, ReadinessReason
from capwatch.server.grpc.encoding import (
    EncodedCycle,
    encode_cycle,
    encode_last_cycle_age,
    encode_readiness,
)
from capwatch.server.grpc.mapping import DeviceNamer, Include
from capwatch.server.grpc.publication import Publication

# How long one encoding of the readiness is shared. Ages are reported as of the
# window's end: at most this much too old, never too young.
AGE_WINDOW_S = 0.01
# Cycles whose whole message is kept between sends: the latest few, which every
# stream sends. Every cycle in the ring keeps its encoding but for the readiness.
WIRE_CYCLES = 8

_NEVER = float("-inf")


@dataclass(frozen=True, kw_only=True)
class Window:
    """The readiness every cycle sent in one window carries, as of the window's end."""

    until: float  # monotonic
    sequence: int  # the broadcast's latest cycle when the rule was applied
    ready: Readiness
    verdict: tuple[bool, ReadinessReason, str]
    fields: bytes  # the readiness encoded but for the cycle's own age, its last field


class SharedCycle:
    """One cycle, encoded, and its whole message as sent in the current window."""

    __slots__ = ("_encoded", "_feed", "_until", "_verdict", "_wire", "devices", "report")

    def __init__(
        self,
        report: CycleReport,
        devices: Mapping[int, DeviceState],
        feed: CycleFeed,
        window: Window,
    ) -> None:
        self.report = report
        self.devices = devices  # the table right after this cycle
        self._feed = feed
        self._verdict = window.verdict
        # All but the readiness; the verdict decides the devices' health.
        self._encoded: EncodedCycle = self._encode(window.ready)
        self._until = _NEVER  # end of the window the whole message was made for
        self._wire = b""

    def wire(self, now: float) -> bytes:
        """The serialized ``WatchResponse`` to send at monotonic instant ``now``."""
        if now <= self._until:
            return self._wire
        feed = self._feed
        window = feed.window(now)
        if window.verdict != self._verdict:  # e.g. gone stale: the devices' health changes
            self._encoded, self._verdict = self._encode(window.ready), window.verdict
        age = encode_last_cycle_age(window.until - self.report.finished_monotonic)
        wire = self._encoded.watch_response(window.fields + age)
        # Kept for the other streams of this window only if the cycle is one of
        # the latest: an older one is a resume's, sent by that stream alone.
        if self.report.sequence > feed.broadcast.sequence - WIRE_CYCLES:
            if self._until == _NEVER:
                feed.hold(self)
            self._wire, self._until = wire, window.until
        return wire

    def forget(self) -> None:
        """Drop the whole message (the encoding stays): the next send makes it again."""
        self._until, self._wire = _NEVER, b""

    def _encode(self, ready: Readiness) -> EncodedCycle:
        return encode_cycle(self.report, devices=self.devices, namer=self._feed.namer, ready=ready)


class CycleFeed:
    def __init__(self, publication: Publication) -> None:
        self._pub = publication
        # As long as the hub's ring: a resume the hub could serve, this can.
        self.broadcast: Broadcast[SharedCycle] = Broadcast(capacity=publication.hub.capacity)
        self._window: Window | None = None
        self._wired: deque[SharedCycle] = deque()

    @property
    def namer(self) -> DeviceNamer:
        return self._pub.namer

    def catch_up(self) -> None:
        """Encode and publish every report the hub holds and the broadcast does not."""
        recorded = self._pub.hub.history(self.broadcast.sequence)
        if recorded:
            window = self.window(self._pub.clock.monotonic())
            for report, devices in recorded:
                self.broadcast.publish(report.sequence, SharedCycle(report, devices, self, window))

    async def run(self) -> None:
        """Feed the broadcast until the hub releases its readers; then close it."""
        hub = self._pub.hub
        try:
            while True:
                self.catch_up()
                if hub.readers_released:
                    return
                await hub.wait(self.broadcast.sequence)
        finally:  # however the feed ends, the streams following it end too
            self.broadcast.close()

    def window(self, now: float) -> Window:
        """The window a cycle sent at monotonic instant ``now`` is sent in.

        One readiness for every cycle sent in it: the rule on the hub's state,
        as of the window's end. A new cycle opens a new window.
        """
        window, latest = self._window, self.broadcast.sequence
        if window is not None and now <= window.until and window.sequence == latest:
            return window
        hub = self._pub.hub
        until = now + AGE_WINDOW_S
        ready = hub.readiness(hub.state(), now=until)
        self._window = window = Window(
            until=until,
            sequence=latest,
            ready=ready,
            verdict=(ready.ready, ready.reason, ready.detail),
            fields=encode_readiness(ready, last_cycle_age_s=None),
        )
        return window

    def filtered(self, cycle: SharedCycle, include: Include) -> bytes:
        """``cycle`` with only the devices ``include`` admits, its ages as of now."""
        view = self._pub.view()
        ready = view.readiness
        encoded = encode_cycle(
            cycle.report, devices=cycle.devices, namer=self._pub.namer, ready=ready, include=include
        )
        age = view.now_monotonic - cycle.report.finished_monotonic
        return encoded.watch_response(encode_readiness(ready, last_cycle_age_s=age))

    def hold(self, cycle: SharedCycle) -> None:
        """Note that ``cycle`` keeps its whole message now; only the last few sent do."""
        self._wired.append(cycle)
        if len(self._wired) > WIRE_CYCLES:
            self._wired.popleft().forget()
