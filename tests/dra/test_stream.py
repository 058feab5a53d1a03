"""NodeWatchResources as the kubelet sees it: full lists, re-sends, staleness, names, versions.

Every message read also passes the per-message checks in tests/dra/client.py
(every GPU listed in order, pool name, timeout field, message length, unix
seconds, no fields the kubelet does not know).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable

import pytest

from capwatch.agent.reports import AbortReason, GpuResult
from tests.dra.client import KubeletStream, Received
from tests.dra.conftest import Serve
from tests.dra.kubelet_api import VERSIONS, KubeletApi
from tests.server.harness import NODE, UUIDS, failed, idle, ok, released, settings_for

pytestmark = pytest.mark.asyncio

QUIET = 30.0  # an interval long enough that no re-send interleaves with a test's steps
# A cycle's list must arrive well before the next re-send would (30 s): a read timeout
# that only guards against a hang, never a bound a loaded machine can reach.
PROMPT = 5.0


def _all(health: str) -> list[str]:
    return [health] * len(UUIDS)


@pytest.mark.parametrize("version", VERSIONS)
async def test_open_lists_every_gpu_as_unknown_before_the_first_cycle(
    serve: Serve, kubelet: dict[str, KubeletApi], version: str
) -> None:
    """The first message, sent on open before any cycle, lists every GPU as UNKNOWN
    with a message saying no cycle has reported yet."""
    harness = await serve(interval_s=QUIET)
    api = kubelet[version]
    async with harness.channel() as channel:
        first = await KubeletStream(channel, api, interval_s=QUIET).read()
    assert first.health(api) == _all("UNKNOWN")
    assert all("no enforcement cycle" in m for m in first.messages)


@pytest.mark.parametrize("version", VERSIONS)
async def test_every_cycle_sends_a_new_full_list(
    serve: Serve, kubelet: dict[str, KubeletApi], version: str
) -> None:
    """Each cycle is followed promptly by a list of every GPU, including GPUs the
    cycle did not reach (they keep their last state): lists, never deltas."""
    harness = await serve(interval_s=QUIET)
    api = kubelet[version]
    async with harness.channel() as channel:
        stream = KubeletStream(channel, api, interval_s=QUIET)
        await stream.read()
        steps: list[tuple[list[GpuResult], list[str]]] = [
            ([ok(0), ok(1), ok(2)], ["HEALTHY", "HEALTHY", "HEALTHY"]),
            ([failed(0), idle(1), released(2)], ["UNHEALTHY", "HEALTHY", "HEALTHY"]),
            ([ok(1)], ["UNHEALTHY", "HEALTHY", "HEALTHY"]),  # only GPU 1 reached
            ([ok(0)], ["HEALTHY", "HEALTHY", "HEALTHY"]),
        ]
        previous: Received | None = None
        for gpus, expected in steps:
            published = time.monotonic()
            harness.publish(gpus)
            got = await stream.read(timeout=PROMPT)
            assert got.at - published < PROMPT
            assert got.health(api) == expected
            if previous is not None and len(gpus) == 1:
                untouched = [n for n in got.by_name if n != f"gpu-{gpus[0].index}"]
                for name in untouched:
                    assert got.by_name[name] == previous.by_name[name]
            previous = got


@pytest.mark.parametrize("version", VERSIONS)
async def test_list_is_resent_within_the_timeout_when_nothing_happens(
    serve: Serve, kubelet: dict[str, KubeletApi], version: str
) -> None:
    """With no cycle published, the same list is re-sent every interval (plus
    scheduling slack), inside health_check_timeout_seconds = ceil(3 x interval), so the
    kubelet never expires a device of a live agent."""
    interval = 0.5
    harness = await serve(interval_s=interval)
    api = kubelet[version]
    async with harness.channel() as channel:
        stream = KubeletStream(channel, api, interval_s=interval)
        received = [await stream.read() for _ in range(4)]
    gaps = [later.at - earlier.at for earlier, later in itertools.pairwise(received)]
    timeout = received[0].response.devices[0].health_check_timeout_seconds
    assert timeout == math.ceil(3 * interval)
    # The kubelet's expiry runs on real time, so this stays a wall-clock bound, but a
    # whole second of slack (a loaded 2-core machine) is still inside its 2 s timeout.
    assert all(interval * 0.5 <= gap <= interval + 1.0 for gap in gaps), gaps
    assert max(gaps) < timeout
    assert len({r.response.SerializeToString(deterministic=True) for r in received}) == 1


STALE_CASES = {
    "all-enforced": ([ok(0), ok(1), ok(2)], None, ["HEALTHY", "HEALTHY", "HEALTHY"]),
    "one-failed": ([failed(0), ok(1), idle(2)], None, ["UNHEALTHY", "HEALTHY", "HEALTHY"]),
    "aborted": (None, AbortReason.POD_VIEW_NOT_SYNCED, ["UNKNOWN", "UNKNOWN", "UNKNOWN"]),
}


@pytest.mark.parametrize("case", sorted(STALE_CASES))
async def test_every_gpu_turns_unknown_when_no_cycle_completes_within_the_bound(
    serve: Serve, kubelet: dict[str, KubeletApi], case: str
) -> None:
    """Once no cycle has completed for the staleness bound (3 x interval), every GPU
    is UNKNOWN with the staleness message, whatever the last cycle said (a failed
    or aborted last cycle must not pin its health forever); a new cycle recovers."""
    interval = 0.1
    bound = 3 * interval
    gpus, abort, before = STALE_CASES[case]
    harness = await serve(interval_s=interval)
    api = kubelet["v1"]
    async with harness.channel() as channel:
        stream = KubeletStream(channel, api, interval_s=interval)
        await stream.read()
        harness.publish()  # so every GPU has a result for the last cycle to override
        await stream.read(timeout=PROMPT)
        report = harness.publish(gpus, abort=abort)
        fresh = await stream.read(timeout=PROMPT)
        assert fresh.health(api) == before
        # A hang guard: without the staleness rule the last cycle's health would be
        # re-sent for ever.
        seen = await stream.read_until(
            lambda r: all("staleness" in m for m in r.messages), timeout=bound + 10.0
        )
        stale = seen[-1]
        assert stale.health(api) == _all("UNKNOWN")
        assert all(r.health(api) == before for r in seen[:-1])
        age = stale.at - report.finished_monotonic
        # Not before the bound; after it, on a re-send (every 0.1 s): the upper bound, at
        # 20 intervals, says it came on one of them rather than bounding how soon.
        assert bound <= age <= bound + 20 * interval, age
        assert stale.messages[0] not in fresh.messages
        harness.publish()
        recovered = await stream.read_until(
            lambda r: r.health(api) == _all("HEALTHY"), timeout=PROMPT
        )
        assert len(recovered) == 1


@pytest.mark.parametrize("version", VERSIONS)
async def test_names_default_to_node_and_gpu_index(
    serve: Serve, kubelet: dict[str, KubeletApi], version: str
) -> None:
    """Without flags, pool_name is the node name and device_name is gpu-<index>."""
    harness = await serve(interval_s=QUIET)
    async with harness.channel() as channel:
        first = await KubeletStream(channel, kubelet[version], interval_s=QUIET).read()
    assert [(d.device.pool_name, d.device.device_name) for d in first.response.devices] == [
        (NODE, "gpu-0"),
        (NODE, "gpu-1"),
        (NODE, "gpu-2"),
    ]


@pytest.mark.parametrize(
    ("pool_flag", "template", "pool", "names"),
    [
        ("pool-a", "gpu-{uuid}", "pool-a", [f"gpu-{u.lower()}" for u in UUIDS]),
        ("", "nvidia-{index}", NODE, ["nvidia-0", "nvidia-1", "nvidia-2"]),
    ],
)
async def test_names_follow_the_dra_flags(
    serve: Serve,
    kubelet: dict[str, KubeletApi],
    pool_flag: str,
    template: str,
    pool: str,
    names: list[str],
) -> None:
    """--dra-pool-name and --dra-device-name set the names in both versions, so they
    can match the DRA driver's ResourceSlices."""
    settings = settings_for(extra={"dra_pool_name": pool_flag, "dra_device_name": template})
    harness = await serve(interval_s=QUIET, settings=settings)
    async with harness.channel() as channel:
        for version in VERSIONS:
            stream = KubeletStream(
                channel, kubelet[version], interval_s=QUIET, pool=pool, names=names
            )
            first = await stream.read()
            assert [d.device.device_name for d in first.response.devices] == names
            assert {d.device.pool_name for d in first.response.devices} == {pool}


async def test_both_versions_answer_identically(
    serve: Serve, kubelet: dict[str, KubeletApi]
) -> None:
    """v1alpha1 and v1 send the same bytes for the same state: on open, after a
    mixed cycle and after an aborted one."""
    harness = await serve(interval_s=QUIET)
    async with harness.channel() as channel:
        streams = [KubeletStream(channel, kubelet[v], interval_s=QUIET) for v in VERSIONS]
        steps: list[Callable[[], object]] = [
            lambda: None,
            lambda: harness.publish([failed(0), idle(1), released(2)]),
            lambda: harness.publish(abort=AbortReason.INTERNAL_ERROR),
        ]
        for step in steps:
            step()
            alpha, ga = [await s.read(timeout=PROMPT) for s in streams]
            assert alpha.response.SerializeToString(
                deterministic=True
            ) == ga.response.SerializeToString(deterministic=True)


@pytest.mark.parametrize("version", VERSIONS)
async def test_last_updated_time_is_the_gpus_last_report_in_unix_seconds(
    serve: Serve, kubelet: dict[str, KubeletApi], version: str
) -> None:
    """last_updated_time is whole unix seconds: the start-up time before any cycle,
    then the finish time of the cycle that last reached each GPU."""
    before = time.time()
    harness = await serve(interval_s=QUIET)
    after = time.time()
    api = kubelet[version]
    async with harness.channel() as channel:
        stream = KubeletStream(channel, api, interval_s=QUIET)
        first = await stream.read()
        assert all(int(before) <= d.last_updated_time <= int(after) for d in first.response.devices)
        everyone = harness.publish()
        got = await stream.read(timeout=PROMPT)
        assert [d.last_updated_time for d in got.response.devices] == [
            int(everyone.finished_wall)
        ] * 3
        only_one = harness.publish([ok(1)])
        got = await stream.read(timeout=PROMPT)
        assert [d.last_updated_time for d in got.response.devices] == [
            int(everyone.finished_wall),
            int(only_one.finished_wall),
            int(everyone.finished_wall),
        ]
