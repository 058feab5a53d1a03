"""``capwatch shim`` as a real process: its /readyz over real HTTP, fed by a real stream.

The agent side is either the harness (a real gRPC server in this event loop
whose cycles the test publishes) or a real ``capwatch agent`` on the sim
backend. Times are compared on the monotonic clock, which the test and every
process on the machine share.
"""

from __future__ import annotations

import re
import signal
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from capwatch.agent.reports import CycleReport
from capwatch.client.node_health import NodeHealthClient
from tests.server.harness import failed, ok
from tests.shim.support import (
    START_S,
    Launcher,
    check_staleness,
    publish_crash,
    publish_cycle,
    shim_argv,
    until,
)

pytestmark = pytest.mark.asyncio

READY_WITHIN_S = 2.0  # from a good cycle published to a 200 seen


@pytest_asyncio.fixture
async def launch(tmp_path: Path) -> AsyncIterator[Launcher]:
    """Starts processes and harnesses for one test; stops all of them afterwards."""
    launcher = Launcher(tmp_path)
    yield launcher
    await launcher.close()


@pytest.fixture
def short_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with a short path: a unix socket path must fit in 108 bytes."""
    return tmp_path_factory.mktemp("cw", numbered=True)


async def test_not_ready_before_the_first_good_cycle_then_ready_at_once(launch: Launcher) -> None:
    """503 no-cycle-yet from a connected shim with no cycle yet; 200 within 2 s of the
    first good one."""
    harness = await launch.harness(interval_s=0.5)
    shim = await launch.shim(harness.target)
    await until(
        lambda: harness.publication.subscribers == 1, within=START_S, what="shim subscribed"
    )
    before = await shim.probe()
    assert (before.status, before.reason, before.good_age_s) == (503, "no-cycle-yet", None)
    assert before.body == "not ready: no-cycle-yet; last good cycle never\n"

    publish_cycle(harness)
    published = time.monotonic()
    after = await shim.until(lambda a: a.status == 200, within=READY_WITHIN_S, what="200")
    assert after.received - published < READY_WITHIN_S
    assert after.body.startswith("ok: last good cycle ")
    assert all(a.reason in ("no-cycle-yet", "ready") for a in shim.history)


async def test_hung_cycle_goes_stale_at_three_intervals(launch: Launcher) -> None:
    """With no cycle completing, 200 holds until 3 x interval after the last one, then 503 stale."""
    interval = 0.3
    bound = 3 * interval
    harness, shim = await launch.ready_shim(interval_s=interval)

    last = publish_cycle(harness)  # then the next cycle hangs: nothing more is published
    await shim.until(lambda a: a.reason == "stale", within=bound + 3, what="stale")
    answers = [a for a in shim.history if a.sent >= last.finished_monotonic]
    answers += await shim.probe_for(0.2)
    check_staleness(answers, finished=last.finished_monotonic, bound=bound)
    ready = [a for a in answers if a.status == 200]
    stale = [a for a in answers if a.reason == "stale"]
    assert ready[-1].sent >= last.finished_monotonic + bound / 2, "no 200 just before the bound"
    assert stale[0].sent <= last.finished_monotonic + bound + 0.5, "503 came late"
    assert answers[len(ready) :] == stale, "ready again with no new cycle"
    assert "no cycle completed for" in stale[0].body
    assert f"(bound {bound:g}s)" in stale[0].body


async def test_failed_and_raising_cycles_flip_the_next_poll_then_recover(launch: Launcher) -> None:
    """A failed cycle, and a cycle that raised, give 503 at once (not after the staleness
    bound), naming the failure; the next good cycle gives 200 again."""
    interval = 1.0  # stale after 3 s: far from the "at once" being asserted
    harness, shim = await launch.ready_shim(interval_s=interval)

    async def flips_then_recovers(report: CycleReport, detail: str) -> None:
        assert not report.enforced
        flipped = await shim.until(lambda a: a.status == 503, within=interval, what="503")
        assert flipped.received - report.finished_monotonic < interval  # bound: 3 x interval
        assert flipped.body.startswith(f"not ready: cycle-failed: {detail}; last good cycle ")
        assert shim.running
        publish_cycle(harness)
        await shim.until(lambda a: a.status == 200, within=READY_WITHIN_S, what="200 again")

    await flips_then_recovers(harness.publish([failed(0), ok(1), ok(2)]), "gpu0:write_failed")
    await flips_then_recovers(publish_crash(harness, RuntimeError("boom")), "internal_error")


async def test_cycle_longer_than_two_intervals_exposes_a_503_until_it_completes(
    launch: Launcher,
) -> None:
    """The loop sleeps an interval after each cycle, so a healthy cycle lasting over
    2 x interval overshoots the 3 x interval bound: 503 stale until it completes, then 200."""
    interval = 0.2
    bound = 3 * interval
    harness, shim = await launch.ready_shim(interval_s=interval)

    before = publish_cycle(harness)
    started = before.finished_monotonic + interval  # the loop's sleep, then the long cycle
    await shim.until(lambda a: a.reason == "stale", within=bound + 3, what="stale")
    ends = before.finished_monotonic + interval + 2.5 * interval
    during = [a for a in shim.history if a.sent >= before.finished_monotonic]
    during += await shim.probe_for(max(0.0, ends - time.monotonic()))
    check_staleness(during, finished=before.finished_monotonic, bound=bound)

    long_cycle = publish_cycle(harness, started_monotonic=started)
    assert long_cycle.duration_s > 2 * interval
    back = await shim.until(lambda a: a.status == 200, within=READY_WITHIN_S, what="200")
    assert back.received - long_cycle.finished_monotonic < READY_WITHIN_S


async def test_stepping_the_wall_clock_changes_nothing(launch: Launcher) -> None:
    """Cycles whose wall times jump an hour forward, back and forward again keep 200
    throughout with ages in seconds, and staleness still comes 3 x interval after the
    last cycle on the monotonic clock."""
    interval = 0.3
    bound = 3 * interval
    harness, shim = await launch.ready_shim(interval_s=interval)

    throughout = []
    for offset in (3600.0, -3600.0, -3600.0, 3600.0):
        last = publish_cycle(harness, wall_offset_s=offset)
        throughout += await shim.probe_for(interval / 2)
    assert throughout, "no probe answered"
    assert all(a.status == 200 for a in throughout), [a.body for a in throughout]
    assert all(a.good_age_s is not None and a.good_age_s < bound for a in throughout)

    await shim.until(lambda a: a.reason == "stale", within=bound + 3, what="stale")
    after = [a for a in shim.history if a.sent >= last.finished_monotonic]
    check_staleness(after, finished=last.finished_monotonic, bound=bound)
    first_stale = next(a for a in after if a.reason == "stale")
    assert first_stale.sent <= last.finished_monotonic + bound + 0.5


async def test_readyz_is_served_with_the_agents_metrics_off(
    launch: Launcher, short_dir: Path
) -> None:
    """A real sim agent with --metrics-port 0 (no metrics server at all) still feeds the
    shim over its unix socket, and /readyz reaches 200."""
    sock = short_dir / "agent.sock"
    agent = await launch.agent(sock, interval_s=0.2)
    shim = await launch.shim(f"unix://{sock}")
    await shim.until(lambda a: a.status == 200, within=START_S, what="200 from a real agent")
    assert agent.running
    assert "metrics serving" not in agent.err()  # the metrics server really is off


async def test_occupied_port_is_fatal_with_one_line(launch: Launcher, tmp_path: Path) -> None:
    """A /readyz port someone else listens on makes the shim exit 1 at once (cannot
    start, as for the agent's ports), with one stderr line naming --readyz-port and the port."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        shim = launch.spawn(shim_argv(f"unix://{tmp_path}/agent.sock", port))
        code = await shim.exited(within=START_S)
    assert code == 1
    err = shim.err()
    assert err.count("\n") == 1, err
    assert err.startswith("capwatch shim: cannot start: --readyz-port: cannot serve /readyz on ")
    assert f"127.0.0.1:{port}" in err
    assert shim.out() == ""


async def test_probes_write_no_log_lines(launch: Launcher) -> None:
    """Twenty probes add no line to the shim's output: it logs its start line and
    stream events, never a request."""
    _, shim = await launch.ready_shim(interval_s=5.0)  # stale only after 15 s
    before = shim.lines()

    answers = [await shim.probe() for _ in range(20)]
    assert [a.status for a in answers] == [200] * 20
    await shim.probe_for(0.2)  # time for any line a request might still write
    assert shim.lines() == before
    assert await shim.terminate() == 0
    assert shim.out() == ""
    assert [line for line in shim.lines() if "readyz" in line.lower()] == [
        line for line in before if "serving /readyz" in line
    ]
    assert len([line for line in before if "serving /readyz" in line]) == 1


async def test_agent_killed_fails_closed_until_a_fresh_good_cycle(
    launch: Launcher, short_dir: Path
) -> None:
    """SIGKILL the agent: 503 stream-lost at once (not after the staleness bound), and it
    stays 503 while the agent is down and after a new agent is back, until that agent
    completes a good cycle after the reconnect (its snapshot's cycle is not enough)."""
    interval = 1.0  # stale after 3 s
    sock = short_dir / "agent.sock"
    agent = await launch.agent(sock, interval_s=interval)
    shim = await launch.shim(f"unix://{sock}")
    await shim.until(lambda a: a.status == 200, within=START_S, what="200 from a real agent")

    agent.send(signal.SIGKILL)
    killed = time.monotonic()
    lost = await shim.until(lambda a: a.status == 503, within=3 * interval, what="503")
    assert lost.reason == "stream-lost"
    assert lost.received - killed < interval
    down = await shim.probe_for(0.3)
    assert {a.reason for a in down} == {"stream-lost"}

    # Hold the shim still until the new agent's first cycle is done, so its
    # reconnect snapshot already carries a good cycle.
    shim.send(signal.SIGSTOP)
    try:
        second = await launch.agent(sock, interval_s=1.5)
        await until(
            lambda: "cycle seq=1 enforced=true" in second.err(), within=START_S, what="cycle 1"
        )
    finally:
        shim.send(signal.SIGCONT)
    resumed = len(shim.history)
    back = await shim.until(lambda a: a.status == 200, within=START_S, what="200 again")
    async with NodeHealthClient(target=f"unix://{sock}") as client:
        snapshot = await client.snapshot()
    assert snapshot.sequence >= 2, "ready on the reconnect snapshot's cycle alone"
    assert {a.reason for a in shim.history[resumed:-1]} <= {"stream-lost"}
    assert back.good_age_s is not None
    assert back.good_age_s < 3 * 1.5


async def test_ready_again_within_about_an_interval_after_an_agent_outage(
    launch: Launcher, short_dir: Path
) -> None:
    """After an outage long enough for a network target's backoff to reach seconds,
    the shim on the agent's unix socket has retried at least once an interval (never
    a longer wait), and answers 200 again within a few intervals of the new agent
    serving, not the up to 10 s more of the old backoff."""
    interval = 0.5
    sock = short_dir / "agent.sock"
    agent = await launch.agent(sock, interval_s=interval)
    shim = await launch.shim(f"unix://{sock}")
    await shim.until(lambda a: a.status == 200, within=START_S, what="200 from a real agent")

    agent.send(signal.SIGKILL)
    await shim.until(lambda a: a.reason == "stream-lost", within=START_S, what="503")
    # Uncapped, the waits would now be 0.2, 0.4, 0.8, 1.6, 3.2 s... (full jitter).
    await shim.probe_for(4.0)
    await launch.agent(sock, interval_s=interval)  # returns once it is serving
    back = time.monotonic()
    ready = await shim.until(lambda a: a.status == 200, within=START_S, what="200 again")
    waits = [float(w) for w in re.findall(r"retry_in=([0-9.]+)", shim.err())]
    assert len(waits) >= 4, shim.err()
    assert max(waits) <= interval, shim.err()
    # A reconnect (at most one interval) and a fresh cycle (at most one more),
    # with room for a loaded machine.
    assert ready.received - back < 2 + 4 * interval, shim.err()


@pytest.mark.parametrize("agent_up", [True, False], ids=["streaming", "agent-unreachable"])
async def test_sigterm_stops_the_shim_cleanly(
    launch: Launcher, tmp_path: Path, agent_up: bool
) -> None:
    """SIGTERM stops the shim with exit 0 and no traceback, whether it is streaming or
    waiting to reconnect to an agent that is not there."""
    if agent_up:
        _, shim = await launch.ready_shim(interval_s=0.5)
    else:
        shim = await launch.shim(f"unix://{tmp_path}/absent.sock")
        await shim.until(lambda a: a.status == 503, within=START_S, what="503")
    assert await shim.terminate() == 0, shim.err()
    assert "Traceback" not in shim.err()
