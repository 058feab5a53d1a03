"""Stream slots: the unix socket's reserve and the limit per TCP address (server/admission.py).

The rules as a table over :class:`Admission`, then the lock-out they prevent,
over real listeners: one TCP client opening streams until refused leaves the
readiness shim's socket able to subscribe, to Watch and to the DRA stream;
each refusal is a metric and a (throttled) log line.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import grpc
import pytest

from capwatch.api.gen.capwatch.v1 import node_health_pb2 as pb
from capwatch.api.gen.capwatch.v1 import node_health_pb2_grpc as pb_grpc
from capwatch.api.gen.v1 import dra_health_pb2 as dra_pb
from capwatch.api.gen.v1 import dra_health_pb2_grpc as dra_grpc
from capwatch.server.admission import (
    Admission,
    Refusal,
    RefusalReason,
    Slot,
    StreamLimits,
    peer_address,
)
from capwatch.server.metrics.cycle_metrics import Metrics
from tests.metrics.support import scrape, value
from tests.server.harness import ServerHarness, eventually, next_event, running, settings_for


@pytest.mark.parametrize(
    ("peer", "address"),
    [
        ("ipv4:10.1.2.3:43210", "10.1.2.3"),
        ("ipv4:127.0.0.1:1", "127.0.0.1"),
        ("ipv6:%5B2001:db8::7%5D:43210", "2001:db8::7"),
        ("ipv6:%5B::1%5D:5", "::1"),
        ("ipv6:%5B::ffff:10.1.2.3%5D:43210", "10.1.2.3"),  # dual-stack: the IPv4 client
        ("unix:", None),
        ("unix:/run/capwatch/agent.sock", None),
        ("unix-abstract:capwatch", None),
        ("vsock:3:1024", "vsock:3:1024"),  # unknown to us: remote, counted on its own
    ],
)
def test_peer_address_is_the_ip_without_the_port_and_none_for_the_socket(
    peer: str, address: str | None
) -> None:
    """Streams count per IP (a client's connections differ only in port); unix peers are
    local; a transport we do not know is never taken for local."""
    assert peer_address(peer) == address


def test_tcp_peers_stop_at_their_share_and_their_per_address_limit() -> None:
    """With 5 slots, 1 reserved and 2 per address: an address gets 2, TCP as a whole 4,
    the socket the last one; releasing a slot lets the same kind of peer in again."""
    admission = Admission(StreamLimits(max_subscribers=5, reserved_local=1, max_per_peer=2))
    a1, a2 = admission.claim("10.0.0.1"), admission.claim("10.0.0.1")
    assert isinstance(a1, Slot)
    assert isinstance(a2, Slot)
    refused = admission.claim("10.0.0.1")
    assert isinstance(refused, Refusal)
    assert refused.reason is RefusalReason.PEER_LIMIT
    assert refused.message == "stream limit per client address (2) reached for 10.0.0.1"
    b1, c1 = admission.claim("10.0.0.2"), admission.claim("10.0.0.3")
    assert isinstance(b1, Slot)
    assert isinstance(c1, Slot)
    crowded = admission.claim("10.0.0.4")  # its first stream, but the TCP share is full
    assert isinstance(crowded, Refusal)
    assert crowded.reason is RefusalReason.SUBSCRIBER_LIMIT
    assert "TCP clients (4) reached; 1 more are kept for the local socket" in crowded.message
    local = admission.claim(None)
    assert isinstance(local, Slot)
    full = admission.claim(None)
    assert isinstance(full, Refusal)
    assert full.message == "subscriber limit (5) reached"
    assert (admission.subscribers, admission.remote) == (5, 4)
    assert admission.refusals == {
        RefusalReason.SUBSCRIBER_LIMIT: 2,
        RefusalReason.PEER_LIMIT: 1,
    }

    admission.release(a1)
    assert isinstance(admission.claim("10.0.0.1"), Slot)
    admission.release(local)
    assert isinstance(admission.claim(None), Slot)


def test_local_peers_may_take_every_slot_and_released_addresses_are_forgotten() -> None:
    """The reserve limits TCP peers only: the socket may fill every slot. An address whose
    streams have all ended holds no memory."""
    admission = Admission(StreamLimits(max_subscribers=3, reserved_local=1, max_per_peer=3))
    locals_ = [admission.claim(None) for _ in range(3)]
    assert all(isinstance(slot, Slot) for slot in locals_)
    assert isinstance(admission.claim("10.0.0.1"), Refusal)
    for slot in locals_:
        assert isinstance(slot, Slot)
        admission.release(slot)
    remote = admission.claim("10.0.0.1")
    assert isinstance(remote, Slot)
    assert admission.streams_from("10.0.0.1") == 1
    admission.release(remote)
    assert admission.streams_from("10.0.0.1") == 0
    assert (admission.subscribers, admission.remote) == (0, 0)


def test_a_reserve_as_large_as_the_limit_is_refused() -> None:
    """Every slot reserved would leave TCP clients none: a programming error, not a setting."""
    with pytest.raises(ValueError, match="reserved_local"):
        Admission(StreamLimits(max_subscribers=4, reserved_local=4))


def watch(channel: grpc.aio.Channel) -> Any:
    return pb_grpc.NodeHealthServiceStub(channel).Watch(pb.WatchRequest())


def dra(channel: grpc.aio.Channel) -> Any:
    return dra_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
        dra_pb.NodeWatchResourcesRequest()
    )


async def refusal_of(call: Any) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call.read()
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    return str(caught.value.details())


def unix_target(harness: ServerHarness) -> str:
    return next(a for a in harness.server.addresses if a.startswith("unix:"))


@pytest.mark.asyncio
async def test_a_tcp_client_filling_its_share_cannot_lock_out_the_socket(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """4 slots, 1 reserved: one TCP client opening streams until refused gets 3; the unix
    socket still gets a Watch (the readiness shim's stream), and then the limit holds for all."""
    settings = settings_for(
        f"unix://{tmp_path / 'agent.sock'}",
        "127.0.0.1:0",
        extra={"grpc_max_subscribers": "4", "grpc_reserved_local_subscribers": "1"},
    )
    caplog.set_level(logging.WARNING, logger="capwatch.server.grpc.publication")
    async with (
        running(settings=settings) as harness,
        harness.channel() as tcp,
        grpc.aio.insecure_channel(unix_target(harness)) as local,
    ):
        opened = []
        for _ in range(3):
            opened.append(watch(tcp))
            await next_event(opened[-1], "snapshot")
        detail = await refusal_of(dra(tcp))
        assert detail.startswith("subscriber limit for TCP clients (3) reached")

        shim = watch(local)
        assert (await next_event(shim, "snapshot")).node_name == harness.publication.node_name
        assert harness.publication.subscribers == 4
        assert await refusal_of(dra(local)) == "subscriber limit (4) reached"

        opened.pop().cancel()  # a TCP stream ends: its slot is free for TCP again

        async def freed() -> bool:
            return harness.publication.subscribers == 3

        await eventually(freed)
        again = watch(tcp)
        await next_event(again, "snapshot")
        for call in (*opened, again, shim):
            call.cancel()
    refused = [
        r.getMessage() for r in caplog.records if r.name == "capwatch.server.grpc.publication"
    ]
    assert len(refused) == 2
    assert refused[0].startswith("stream refused peer=ipv4:127.0.0.1:")
    assert "reason=subscriber_limit" in refused[0]


@pytest.mark.asyncio
async def test_one_address_holds_at_most_its_limit_and_the_socket_is_not_limited(
    tmp_path: Path,
) -> None:
    """With 2 streams per address, a third from 127.0.0.1 (Watch or DRA) is refused while
    slots remain, and counted; the unix socket, not an address, opens DRA streams freely."""
    settings = settings_for(
        f"unix://{tmp_path / 'agent.sock'}",
        "127.0.0.1:0",
        extra={"grpc_max_streams_per_peer": "2"},
    )
    async with (
        running(settings=settings) as harness,
        harness.channel() as tcp,
        grpc.aio.insecure_channel(unix_target(harness)) as local,
    ):
        first, second = watch(tcp), dra(tcp)
        await next_event(first, "snapshot")
        assert len((await second.read()).devices) == 3
        for refused in (watch(tcp), dra(tcp)):
            detail = await refusal_of(refused)
            assert detail == "stream limit per client address (2) reached for 127.0.0.1"
        kubelet = [dra(local) for _ in range(3)]
        for call in kubelet:
            assert len((await call.read()).devices) == 3
        found = scrape(Metrics(publication=harness.publication).registry)
        assert value(found, "capwatch_stream_refusals_total", reason="peer_limit") == 2
        assert value(found, "capwatch_stream_refusals_total", reason="subscriber_limit") == 0
        for call in (first, second, *kubelet):
            call.cancel()
