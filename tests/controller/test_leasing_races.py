"""The election's races that client-go's own tests pin down, on virtual time: a release
that loses to the leader's own renewal in flight, metadata-only changes of the Lease, and
a Lease deleted under a holder that may still write (controller/leasing.py)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from tests.controller.fakes import LeaseStore
from tests.controller.lease_rig import CONFIG, MAX_RETRY_S, NAME, Replica, settle, shutdown


@pytest.mark.asyncio
async def test_a_release_after_a_renewal_that_landed_late_still_hands_over_at_once() -> None:
    """Shutdown cancels the elector while its renewal is in flight; the PUT lands anyway
    (it runs on the API client's thread), so the release's write is stale: it gets 409,
    reads the Lease back, sees itself still holding it and clears it from that record.
    The standby takes over within one retry, not after the lease runs out."""
    store = LeaseStore()
    a = Replica(store, "a").start()
    await settle()
    b = Replica(store, "b", seed=1).start()
    await settle()
    a.api.slow_answer_s = 5.0
    await asyncio.sleep(CONFIG.retry_s + 0.5)  # a's renewal landed; its answer is on the way
    assert store.writes_by("a")[-1][0].renew_time != store.writes_by("a")[0][0].renew_time
    await a.crash()  # cancelled before the answer came: a's record is one version behind
    a.api.slow_answer_s = 0.0
    await a.elector.release()
    released_at = a.clock.monotonic()
    assert store.leases[NAME].holder == ""
    await asyncio.sleep(MAX_RETRY_S + 0.1)
    assert b.elector.leading
    assert b.started[0] - released_at <= MAX_RETRY_S
    await shutdown(b)


@pytest.mark.asyncio
async def test_a_release_leaves_a_lease_someone_else_took_alone() -> None:
    """If the Lease read back after a 409 names another holder, the release writes
    nothing: the other replica's record is not cleared."""
    store = LeaseStore()
    a = Replica(store, "a").start()
    await settle()
    await a.crash()
    taken = dataclasses.replace(store.leases[NAME], holder="c")
    store.save("c", NAME, taken)
    await a.elector.release()
    assert store.leases[NAME].holder == "c"
    assert [who for who, _, _ in store.writes][-1] == "c"


@pytest.mark.asyncio
async def test_metadata_only_changes_restart_no_followers_timer() -> None:
    """A dead holder's Lease whose metadata something touches every 4 s (a new
    resourceVersion, the same spec): the standby still takes over one lease duration
    after it last saw the spec change, as client-go compares the record's spec."""
    store = LeaseStore()
    a = Replica(store, "a").start()
    await settle()
    b = Replica(store, "b", seed=2).start()
    await settle()
    await a.crash()
    last_renewal = store.writes_by("a")[-1][1]

    async def touch() -> None:
        for _ in range(20):  # 80 s of label edits, bounded
            await asyncio.sleep(4.0)
            store.save("labeller", NAME, store.leases[NAME])

    toucher = asyncio.create_task(touch())
    await asyncio.sleep(CONFIG.lease_s + 2 * MAX_RETRY_S + 1)
    assert b.elector.leading
    assert b.started[0] <= last_renewal + CONFIG.lease_s + MAX_RETRY_S + 0.01
    toucher.cancel()
    await shutdown(b)


@pytest.mark.asyncio
async def test_a_deleted_lease_is_not_recreated_while_the_last_holder_may_write() -> None:
    """The Lease is deleted while its holder is cut off (its calls hang, its write budget
    runs down): the standby, which last saw that holder's valid record, waits the record
    out before creating the Lease, so the two never both have write budget."""
    store = LeaseStore()
    a = Replica(store, "a").start()
    await settle()
    b = Replica(store, "b", seed=3).start()
    budgets_when_b_led: list[float] = []
    b.elector.on_started = lambda: budgets_when_b_led.append(a.elector.write_budget())
    await asyncio.sleep(1.0)
    a.api.hung = True
    del store.leases[NAME]
    await asyncio.sleep(CONFIG.lease_s + 2 * MAX_RETRY_S + 1)
    assert b.elector.leading
    assert budgets_when_b_led == [0.0]
    assert not a.elector.leading
    await shutdown(a, b)


@pytest.mark.asyncio
async def test_a_refusal_by_the_api_server_ends_the_term_at_once() -> None:
    """The API server refused a write (fencing policy: this replica is not the holder its
    elector believes it is): it stops leading at once, without waiting out the renew
    deadline, counts the refusal, and campaigns again like any follower, leading again
    if the Lease still names it."""
    store = LeaseStore()
    a = Replica(store, "a").start()
    await settle()
    assert a.elector.leading
    a.elector.lost("capwatch fencing: a does not hold Lease capwatch-controller-0")
    assert not a.elector.leading
    assert a.elector.write_budget() == 0.0
    assert a.stopped == [a.clock.monotonic()]
    assert a.fenced_outs == 1
    await asyncio.sleep(CONFIG.retry_s + MAX_RETRY_S + 0.1)
    assert a.elector.leading  # the Lease still named it: it renewed, and leads again
    assert len(a.started) == 2
    await shutdown(a)
