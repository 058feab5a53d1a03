"""Leader election on a ``coordination.k8s.io/v1`` Lease, for asyncio, by client-go's rules.

One Lease per shard (``capwatch-controller-<shard>``); the replica holding it
writes Node conditions and Events, the others follow the same streams as hot
standbys. The rules are client-go's ``tools/leaderelection``:

- Every ``retry_s`` (2 s) a replica tries to acquire or renew: read the
  Lease; create it if there is none; if another holder's record is still
  valid, back off; otherwise write itself in, the write conditional on the
  ``resourceVersion`` it read (a 409 means another replica won the race).
- A record is valid for its *own* ``leaseDurationSeconds`` (honoured whatever
  this replica's setting) from the moment this replica *observed* its spec
  change, on this process's monotonic clock: the holder's ``renewTime`` is
  another machine's wall clock and is never compared with ours. A change of
  the Lease's metadata alone (a label, an annotation: a new resourceVersion)
  is not a renewal and restarts no timer.
- A Lease that disappears while this replica last saw another holder's valid
  record is not created at once: that holder may still be writing until the
  record it wrote would have expired, so the record is waited out first.
- Writes replace the Lease (PUT) from the object as it was read, so its
  labels, annotations, owner references, finalizers and the spec fields this
  module does not set (``preferredHolder``, ``strategy``) are kept.
- The leader renews every ``retry_s``; if no renewal succeeds within
  ``renew_deadline_s`` (10 s) it stops leading. Every attempt is bounded by
  a timeout (a hung API call cannot hold leadership open).
- Fencing: :meth:`LeaseElector.write_deadline` is the instant the renew
  deadline since the start of the last successful renewal runs out (on this
  process's monotonic clock), so a write starts only while the lease is
  certainly ours and must finish before that instant; the API client checks it
  again on the thread that sends the request, immediately before it goes out
  (:mod:`capwatch.controller.kube`). The ``lease_s - renew_deadline_s`` margin (5 s)
  covers clock-rate differences and a write still in flight, before any other
  replica can see the record expire.
- Release: on a clean shutdown, after this replica's writes have stopped, the
  holder is cleared (``leaseDurationSeconds: 1``) so a standby takes over at
  its next retry instead of waiting out the lease. A renewal of this
  replica's still in flight when the elector was cancelled may land first
  (its request runs on a thread); the release's 409 then reads the Lease back
  and, while it still names this replica, clears it from that record.

Not the Python client's ``leaderelection`` package: it locks a ConfigMap and
compares wall clocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from capwatch.controller.errors import ApiError, Conflict
from capwatch.kit.clock import Clock
from capwatch.kit.errors import ConfigError
from capwatch.kit.observing import UNOBSERVED

log = logging.getLogger(__name__)

JITTER_FACTOR = 1.2  # client-go's: a follower retries after retry_s * (1 + [0, 1.2))
# Floors client-go leaves out (it checks the timings' order and sign, and that the renew
# deadline is more than JITTER_FACTOR retry periods): a try is a Lease read and often a
# write, so a 0.1 s retry period is at most ~20 requests a second per replica; a try may
# take half the renew deadline (attempt_timeout_s), and with less than 0.5 s an API
# server that is merely busy (its SLO: mutating calls within 1 s at p99) costs the lease.
MIN_RETRY_S = 0.1
MIN_RENEW_DEADLINE_S = 1.0


class Fence(Protocol):
    def write_deadline(self) -> float:
        """The instant, on this process's monotonic clock, by which a write must be done:
        none may start at or after it, none may be sent after it (``-inf``: this replica
        must not write; ``inf``: nothing fences it)."""

    def lost(self, why: str) -> None:
        """The API server refused a write because this replica does not hold the Lease
        (its fencing policy): stop writing at once, as if the lease were lost."""


@dataclass(frozen=True, kw_only=True)
class LeaseConfig:
    lease_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_s < self.renew_deadline_s < self.lease_s:
            raise ConfigError(
                "--lease-duration",
                "need retry period < renew deadline < lease duration, all positive",
            )
        # A 1 ms retry period is hundreds of Lease requests a second, per replica.
        if self.retry_s < MIN_RETRY_S:
            raise ConfigError(
                "--retry-period",
                f"must be at least {MIN_RETRY_S:g} s (each try is one or two Lease "
                f"requests), got {self.retry_s:g}",
            )
        if self.renew_deadline_s < MIN_RENEW_DEADLINE_S:
            raise ConfigError(
                "--renew-deadline",
                f"must be at least {MIN_RENEW_DEADLINE_S:g} s (each try may take half of "
                f"it), got {self.renew_deadline_s:g}",
            )
        if self.renew_deadline_s <= JITTER_FACTOR * self.retry_s:
            raise ConfigError(  # client-go's own rule
                "--renew-deadline",
                f"must be more than {JITTER_FACTOR:g} x --retry-period "
                f"({JITTER_FACTOR * self.retry_s:g} s), got {self.renew_deadline_s:g}",
            )

    @property
    def attempt_timeout_s(self) -> float:
        """How long one try (read, then create or update) may take."""
        return max(self.retry_s, self.renew_deadline_s / 2)


@dataclass(frozen=True, kw_only=True)
class LeaseRecord:
    holder: str  # "" once released
    lease_duration_s: int
    acquire_time: str | None = None  # RFC 3339 with microseconds (MicroTime)
    renew_time: str | None = None
    transitions: int = 0
    resource_version: str = ""
    # The whole Lease as read (None: not read, e.g. one being created): what a write
    # keeps of metadata and of spec fields this module does not set.
    raw: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)

    @property
    def spec(self) -> tuple[str, int, str | None, str | None, int]:
        """What the election reads, client-go's LeaderElectionRecord: a change of this is
        a renewal or a new holder; anything else (metadata, resourceVersion) is not."""
        return (
            self.holder,
            self.lease_duration_s,
            self.acquire_time,
            self.renew_time,
            self.transitions,
        )


class LeaseApi(Protocol):
    async def get_lease(self, name: str, *, deadline_s: float) -> LeaseRecord | None:
        """The Lease, or None when there is none. Raises ApiError."""

    async def create_lease(
        self, name: str, record: LeaseRecord, *, deadline_s: float
    ) -> LeaseRecord:
        """Create it; raises Conflict when it exists, ApiError otherwise."""

    async def update_lease(
        self, name: str, record: LeaseRecord, *, deadline_s: float
    ) -> LeaseRecord:
        """Replace it if its resourceVersion is still ``record``'s; raises Conflict if not."""


class LeaseObserver(Protocol):
    def leading(self, leading: bool) -> None: ...

    def holder_changed(self) -> None: ...

    def fenced_out(self) -> None: ...


def micro_time(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    def __init__(
        self,
        *,
        api: LeaseApi,
        name: str,
        identity: str,
        clock: Clock,
        config: LeaseConfig | None = None,
        on_started: Callable[[], None] = lambda: None,
        on_stopped: Callable[[], None] = lambda: None,
        observer: LeaseObserver | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if not identity:
            raise ConfigError("--identity", "must not be empty")
        self._api = api
        self.name = name
        self.identity = identity
        self._clock = clock
        self.config = config or LeaseConfig()
        self.on_started = on_started  # the composition root may set them later
        self.on_stopped = on_stopped
        self._observer: LeaseObserver = observer or UNOBSERVED
        self._rng = rng or random.Random()
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0  # monotonic instant the observed record last changed
        self._renewed_at: float | None = None  # start of the last successful acquire/renew
        self._leading = False
        self._fenced_out = asyncio.Event()  # the API server refused a write of ours

    @property
    def leading(self) -> bool:
        return self._leading

    @property
    def holder(self) -> str:
        """The holder this replica last saw ("" when none)."""
        return "" if self._observed is None else self._observed.holder

    def lost(self, why: str) -> None:
        """The API server's fencing policy refused a write: step down now (no further
        write starts) and campaign again; the Lease says who holds it."""
        if not self._leading:
            return
        log.warning("lost lease=%s: the API server refused a write: %s", self.name, why)
        self._observer.fenced_out()
        self._step_down()
        self._fenced_out.set()

    def write_deadline(self) -> float:
        """When the renew deadline from the start of the last successful renewal runs out
        (``-inf`` unless this replica leads). Absolute, so that however late a write's
        request gets to go out, it is judged against the instant the fence closed."""
        if not self._leading or self._renewed_at is None:
            return -math.inf
        return self._renewed_at + self.config.renew_deadline_s

    def write_budget(self) -> float:
        """Seconds a write may take from now; 0 unless this replica leads, fenced."""
        return max(0.0, self.write_deadline() - self._clock.monotonic())

    async def run(self) -> None:
        """Campaign, lead, and campaign again when leadership is lost; until cancelled."""
        try:
            while True:
                await self._acquire()
                await self._lead()
        finally:
            self._step_down()

    async def _acquire(self) -> None:
        while not await self._try():
            delay = self.config.retry_s * (1 + self._rng.uniform(0, JITTER_FACTOR))
            await asyncio.sleep(delay)
        self._leading = True
        log.info("leading lease=%s identity=%s", self.name, self.identity)
        self._observer.leading(True)
        self.on_started()

    async def _lead(self) -> None:
        self._fenced_out.clear()
        while True:
            with contextlib.suppress(TimeoutError):
                # Between renewals; a refusal by the API server ends the term at once.
                async with asyncio.timeout(self.config.retry_s):
                    await self._fenced_out.wait()
            if self._fenced_out.is_set():
                await asyncio.sleep(self.config.retry_s)  # then campaign like any follower
                return
            # Retry within the renew deadline; give up leadership when it passes.
            while not await self._try():
                if not self._leading:  # someone else holds it now
                    return
                if self.write_budget() <= 0:
                    log.warning(
                        "lost lease=%s: no renewal within %gs",
                        self.name,
                        self.config.renew_deadline_s,
                    )
                    self._step_down()
                    return
                await asyncio.sleep(min(self.config.retry_s, self.write_budget()))

    def _step_down(self) -> None:
        if self._leading:
            self._leading = False
            self._observer.leading(False)
            self.on_stopped()

    async def _try(self) -> bool:
        """One attempt to acquire or renew, bounded in time; True when the lease is ours."""
        started = self._clock.monotonic()
        timeout = self.config.attempt_timeout_s
        if self._leading:
            timeout = min(timeout, max(0.001, self.write_budget()))
        try:
            async with asyncio.timeout(timeout):
                won = await self._try_once(started, timeout)
        except TimeoutError:
            log.info("lease=%s attempt timed out after %.1fs", self.name, timeout)
            return False
        except Conflict:
            log.info("lease=%s changed under this attempt (409)", self.name)
            return False
        except ApiError as exc:
            log.warning("lease=%s attempt failed: %s", self.name, exc)
            return False
        if won:
            self._renewed_at = started
        return won

    async def _try_once(self, started: float, deadline_s: float) -> bool:
        now = micro_time(self._clock.wall())
        # Whole seconds on the record, rounded up: others wait at least as long as this
        # replica's renew deadline assumes (rounding 1.5 down to 1 would leave no margin).
        duration = math.ceil(self.config.lease_s)
        mine = LeaseRecord(
            holder=self.identity, lease_duration_s=duration, acquire_time=now, renew_time=now
        )
        current = await self._api.get_lease(self.name, deadline_s=deadline_s)
        if current is None:
            last = self._observed
            if (
                last is not None
                and last.holder not in ("", self.identity)
                and self._valid(last, started)
            ):
                # Deleted under a holder that may still write until its record would
                # have expired: wait that out before taking over.
                return False
            self._observe(await self._api.create_lease(self.name, mine, deadline_s=deadline_s))
            return True
        self._observe(current)
        held_by_other = current.holder not in ("", self.identity)
        if held_by_other and self._valid(current, started):
            if self._leading:  # it was ours; another replica took it over
                log.warning("lease=%s taken over by %s", self.name, current.holder)
                self._step_down()
            return False
        if current.holder == self.identity:
            record = replace(
                mine, acquire_time=current.acquire_time or now, transitions=current.transitions
            )
        else:
            record = replace(mine, transitions=current.transitions + 1)
        record = replace(record, resource_version=current.resource_version, raw=current.raw)
        self._observe(await self._api.update_lease(self.name, record, deadline_s=deadline_s))
        return True

    def _valid(self, record: LeaseRecord, now: float) -> bool:
        return self._observed_at + record.lease_duration_s > now

    def _observe(self, record: LeaseRecord) -> None:
        before = self._observed
        self._observed = record  # its resourceVersion and metadata are the latest
        if before is not None and before.spec == record.spec:
            return
        self._observed_at = self._clock.monotonic()
        if before is not None and before.holder != record.holder:
            self._observer.holder_changed()

    async def release(self) -> None:
        """Clear the holder if this replica holds the lease (call after writes stopped)."""
        if self._observed is None or self._observed.holder != self.identity:
            return
        self._step_down()
        timeout = self.config.attempt_timeout_s
        try:
            async with asyncio.timeout(timeout):
                released = await self._release(timeout)
        except (TimeoutError, ApiError) as exc:
            log.warning("lease=%s not released (%s); it expires on its own", self.name, exc)
            return
        if released:
            log.info("released lease=%s", self.name)

    async def _release(self, deadline_s: float) -> bool:
        """Write the cleared record; on a 409 read the Lease back and, while it still
        names this replica (its own renewal landed first), clear it from that record."""
        while True:
            observed = self._observed
            if observed is None or observed.holder != self.identity:
                return False  # someone else holds it now: nothing of ours to release
            now = micro_time(self._clock.wall())
            record = replace(
                observed, holder="", lease_duration_s=1, renew_time=now, acquire_time=now
            )
            try:
                written = await self._api.update_lease(self.name, record, deadline_s=deadline_s)
            except Conflict:
                current = await self._api.get_lease(self.name, deadline_s=deadline_s)
                if current is None:
                    return False
                self._observe(current)
                continue
            self._observe(written)
            return True
