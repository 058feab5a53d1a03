"""Health and message per GPU, decoded with the kubelet's classes.

The kubelet turns every change of a device's health or message into a pod
status update, so messages must be stable reason text: equal across cycles
with the same outcome (no watts, no times), different when the outcome changes.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import pytest

from capwatch.agent.gpus import GpuErrorClass
from capwatch.agent.health.faults import FAULTS_PER_GPU_LIMIT, Fault, FaultKind
from capwatch.agent.reports import AbortReason, GpuResult
from tests.dra.client import MAX_MESSAGE, KubeletStream, Received
from tests.dra.conftest import Serve
from tests.dra.kubelet_api import VERSIONS, KubeletApi
from tests.server.harness import ServerHarness, failed, idle, ok, released

pytestmark = pytest.mark.asyncio

QUIET = 30.0  # no re-send interleaves with a test's steps
PROMPT = 5.0  # a hang guard: the list a cycle causes comes long before the next re-send


async def _after(
    harness: ServerHarness,
    stream: KubeletStream,
    gpus: Sequence[GpuResult] | None = None,
    abort: AbortReason | None = None,
) -> Received:
    """Publish one cycle and read the list it causes."""
    harness.publish(gpus, abort=abort)
    return await stream.read(timeout=PROMPT)


@pytest.mark.parametrize("version", VERSIONS)
async def test_health_follows_each_gpus_outcome(
    serve: Serve, kubelet: dict[str, KubeletApi], version: str
) -> None:
    """ENFORCED, IDLE and RELEASED are HEALTHY; FAILED is UNHEALTHY, per GPU."""
    harness = await serve(interval_s=QUIET)
    api = kubelet[version]
    async with harness.channel() as channel:
        stream = KubeletStream(channel, api, interval_s=QUIET)
        await stream.read()
        got = await _after(harness, stream, [ok(0), idle(1), released(2)])
        assert got.health(api) == ["HEALTHY", "HEALTHY", "HEALTHY"]
        got = await _after(
            harness,
            stream,
            gpus=[failed(0), failed(1, GpuErrorClass.NOT_SUPPORTED), ok(2)],
        )
        assert got.health(api) == ["UNHEALTHY", "UNHEALTHY", "HEALTHY"]
        got = await _after(harness, stream, [idle(0), released(1), failed(2)])
        assert got.health(api) == ["HEALTHY", "HEALTHY", "UNHEALTHY"]


@pytest.mark.parametrize("abort", list(AbortReason))
async def test_aborted_cycle_makes_every_gpu_unknown(
    serve: Serve, kubelet: dict[str, KubeletApi], abort: AbortReason
) -> None:
    """After an aborted cycle no GPU's state is known to be current: all UNKNOWN,
    saying why; the next good cycle makes them HEALTHY again."""
    harness = await serve(interval_s=QUIET)
    api = kubelet["v1alpha1"]
    async with harness.channel() as channel:
        stream = KubeletStream(channel, api, interval_s=QUIET)
        await stream.read()
        assert (await _after(harness, stream)).health(api) == ["HEALTHY"] * 3
        got = await _after(harness, stream, abort=abort)
        assert got.health(api) == ["UNKNOWN"] * 3
        assert all("aborted" in m and abort.value in m for m in got.messages)
        assert (await _after(harness, stream)).health(api) == ["HEALTHY"] * 3


async def test_messages_are_stable_across_cycles_with_the_same_outcome(
    serve: Serve, kubelet: dict[str, KubeletApi]
) -> None:
    """Two cycles with the same outcomes but different watts give identical
    messages (and identical lists); no message carries a number at all."""
    harness = await serve(interval_s=QUIET)
    api = kubelet["v1"]
    async with harness.channel() as channel:
        stream = KubeletStream(channel, api, interval_s=QUIET)
        first = await stream.read()
        rounds = [
            ([ok(0, 300), failed(1), idle(2)], [ok(0, 450), failed(1), idle(2)]),
            ([ok(0, 100), ok(1, 200), released(2)], [ok(0, 700), ok(1, 650), released(2)]),
        ]
        seen = [first]
        for one, other in rounds:
            a = await _after(harness, stream, gpus=one)
            b = await _after(harness, stream, gpus=other)
            assert a.messages == b.messages
            assert [d.health for d in a.response.devices] == [d.health for d in b.response.devices]
            seen += [a, b]
    for received in seen:
        for message in received.messages:
            assert len(message) <= MAX_MESSAGE
            assert not re.search(r"\d", message), message


async def test_message_changes_when_the_outcome_class_changes(
    serve: Serve, kubelet: dict[str, KubeletApi]
) -> None:
    """Not reported yet, enforced, idle, released, failed (by error class) and
    aborted each have their own message, so a change of outcome is visible."""
    harness = await serve(interval_s=QUIET)
    api = kubelet["v1"]
    async with harness.channel() as channel:
        stream = KubeletStream(channel, api, interval_s=QUIET)
        texts = {"not-reported": (await stream.read()).messages[0]}
        steps: dict[str, tuple[list[GpuResult] | None, AbortReason | None]] = {
            "enforced": ([ok(0)], None),
            "idle": ([idle(0)], None),
            "released": ([released(0)], None),
            "failed-permission": ([failed(0, GpuErrorClass.NO_PERMISSION)], None),
            "failed-unsupported": ([failed(0, GpuErrorClass.NOT_SUPPORTED)], None),
            "aborted": (None, AbortReason.POD_VIEW_NOT_SYNCED),
        }
        for name, (gpus, abort) in steps.items():
            texts[name] = (await _after(harness, stream, gpus, abort)).messages[0]
    assert len(set(texts.values())) == len(texts), texts
    assert all(t.startswith("capwatch: ") for t in texts.values())


def _faulted(result: GpuResult, *faults: Fault) -> GpuResult:
    return dataclasses.replace(result, faults=faults)


def _xid(code: int, count: int, last: float) -> Fault:
    return Fault(
        kind=FaultKind.XID, code=code, first_seen_wall=1.0, last_seen_wall=last, count=count
    )


LOST = Fault(kind=FaultKind.GPU_LOST, code=0, first_seen_wall=1.0, last_seen_wall=2.0, count=1)


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_device_fault_is_unhealthy_with_a_stable_message_naming_it(
    serve: Serve, kubelet: dict[str, KubeletApi], version: str
) -> None:
    """A GPU with an active fault is UNHEALTHY though its cap is enforced; the message
    names the fault and stays the same while only its count and times move; when the
    fault clears the GPU is HEALTHY with the plain enforced message again."""
    harness = await serve(interval_s=QUIET)
    api = kubelet[version]
    async with harness.channel() as channel:
        stream = KubeletStream(channel, api, interval_s=QUIET)
        await stream.read()
        plain = await _after(harness, stream, [ok(0), ok(1), idle(2)])
        first = await _after(harness, stream, [_faulted(ok(0), _xid(79, 1, 5.0)), ok(1), idle(2)])
        assert first.health(api) == ["UNHEALTHY", "HEALTHY", "HEALTHY"]
        assert first.messages[0] == "capwatch: device fault (XID 79); power cap enforced"
        again = await _after(harness, stream, [_faulted(ok(0), _xid(79, 40, 9.0)), ok(1), idle(2)])
        assert again.messages == first.messages
        both = await _after(
            harness, stream, [_faulted(failed(0, GpuErrorClass.GPU_IS_LOST), LOST), ok(1), idle(2)]
        )
        assert both.health(api)[0] == "UNHEALTHY"
        assert both.messages[0].startswith(
            "capwatch: device fault (GPU lost); power cap not enforced"
        )
        healed = await _after(harness, stream, [ok(0), ok(1), idle(2)])
        assert healed.health(api) == ["HEALTHY"] * 3
        assert healed.messages == plain.messages


async def test_a_fault_message_is_bounded_however_many_faults(
    serve: Serve, kubelet: dict[str, KubeletApi]
) -> None:
    """Even a GPU carrying every distinct XID the tracker keeps stays within the kubelet's limit."""
    harness = await serve(interval_s=QUIET)
    api = kubelet["v1"]
    many = tuple(_xid(4_000_000_000 + i, 1, 2.0) for i in range(FAULTS_PER_GPU_LIMIT))
    async with harness.channel() as channel:
        stream = KubeletStream(channel, api, interval_s=QUIET)
        await stream.read()
        got = await _after(harness, stream, [_faulted(ok(0), *many), ok(1), idle(2)])
        assert got.health(api)[0] == "UNHEALTHY"
        assert len(got.messages[0]) <= MAX_MESSAGE
        assert got.messages[0].startswith("capwatch: device fault (XID 4000000000, ")
