"""Who may open a stream: the subscriber limit, the local reserve, and a limit per address.

Every Watch and NodeWatchResources stream of the agent holds one of
``max_subscribers`` slots, whichever service and listener it came in on, and
every Watch of the controller's cluster stream one of its own (generic server
plumbing, like :mod:`capwatch.server.listeners`, so both may use it). The rules:

- A local peer (one on the unix socket: the readiness shim, and whatever
  else the socket's group lets in) may take any free slot.
- TCP peers together may hold at most ``max_subscribers - reserved_local``
  slots: the last ``reserved_local`` are kept for the socket, so however many
  streams crowd the TCP port, the shim (and a kubelet-style DRA client on the
  socket) still subscribes and readiness does not fail for want of a slot.
- One TCP peer address may hold at most ``max_per_peer`` streams, so a single
  client cannot take the whole TCP share. The address is the IP alone (a
  client's connections differ only in port); an IPv4-mapped IPv6 address
  counts as its IPv4 address. Clients behind one NAT address share it.

Loopback TCP (127.0.0.1, ::1) is a TCP peer like any other: only the socket's
file mode says who is local. A refusal ends the call with RESOURCE_EXHAUSTED
and a message naming the limit; the agent's counts are metrics
(``capwatch_stream_refusals_total``).
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True, kw_only=True)
class StreamLimits:
    max_subscribers: int
    reserved_local: int = 0
    max_per_peer: int | None = None  # None: only the TCP share limits a peer

    @property
    def tcp_share(self) -> int:
        return self.max_subscribers - self.reserved_local


class RefusalReason(str, Enum):
    SUBSCRIBER_LIMIT = "subscriber_limit"  # every slot open to this peer is taken
    PEER_LIMIT = "peer_limit"  # this TCP address holds its most


@dataclass(frozen=True, kw_only=True)
class Slot:
    """A claimed slot; give it back to :meth:`Admission.release` when the stream ends."""

    address: str | None  # None: a local peer


@dataclass(frozen=True, kw_only=True)
class Refusal:
    reason: RefusalReason
    message: str


def peer_address(peer: str) -> str | None:
    """The address a gRPC peer (``context.peer()``) counts under; None for the unix socket.

    grpc writes ``ipv4:10.0.0.1:43210``, ``ipv6:%5B2001:db8::1%5D:43210`` and
    ``unix:`` (any unix socket, abstract ones included).
    """
    scheme, _, rest = peer.partition(":")
    if scheme.startswith("unix"):
        return None
    host = urllib.parse.unquote(rest).rpartition(":")[0].removeprefix("[").removesuffix("]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:  # not a transport grpc reports today: a peer of its own, not local
        return peer
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


class Admission:
    """The slot counts, and the rules above applied to each new stream (on the event loop)."""

    def __init__(self, limits: StreamLimits) -> None:
        if not 0 <= limits.reserved_local < limits.max_subscribers:
            raise ValueError(f"reserved_local must be below max_subscribers: {limits}")
        self.limits = limits
        self.subscribers = 0
        self.remote = 0  # of which TCP peers
        self.refusals = dict.fromkeys(RefusalReason, 0)
        self._per_address: dict[str, int] = {}  # only addresses holding a slot

    def claim(self, address: str | None) -> Slot | Refusal:
        """A slot for a peer at ``address`` (None: local), or why there is none."""
        limits = self.limits
        refusal = None
        if self.subscribers >= limits.max_subscribers:
            refusal = Refusal(
                reason=RefusalReason.SUBSCRIBER_LIMIT,
                message=f"subscriber limit ({limits.max_subscribers}) reached",
            )
        elif address is not None and self.remote >= limits.tcp_share:
            refusal = Refusal(
                reason=RefusalReason.SUBSCRIBER_LIMIT,
                message=f"subscriber limit for TCP clients ({limits.tcp_share}) reached; "
                f"{limits.reserved_local} more are kept for the local socket",
            )
        elif (
            address is not None
            and limits.max_per_peer is not None
            and self._per_address.get(address, 0) >= limits.max_per_peer
        ):
            refusal = Refusal(
                reason=RefusalReason.PEER_LIMIT,
                message=f"stream limit per client address ({limits.max_per_peer}) "
                f"reached for {address}",
            )
        if refusal is not None:
            self.refusals[refusal.reason] += 1
            return refusal
        self.subscribers += 1
        if address is not None:
            self.remote += 1
            self._per_address[address] = self._per_address.get(address, 0) + 1
        return Slot(address=address)

    def release(self, slot: Slot) -> None:
        self.subscribers -= 1
        if slot.address is None:
            return
        self.remote -= 1
        left = self._per_address[slot.address] - 1
        if left:
            self._per_address[slot.address] = left
        else:
            del self._per_address[slot.address]

    def streams_from(self, address: str) -> int:
        return self._per_address.get(address, 0)
