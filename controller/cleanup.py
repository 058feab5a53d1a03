"""``capwatch controller cleanup``: remove ``GPUPowerCapEnforced`` from every Node, and the
release's DeviceTaintRules.

Run by the chart's post-delete hook (``controller.cleanupOnDelete``), so that
uninstalling capwatch does not leave every node carrying a condition nobody
updates any more (it would read as the last thing the controller said, for
ever); post-delete, since a running leader would write a removed condition
back. Every node is listed (not only the GPU nodes: the selector may have
changed since the condition was written), a page at a time, and each one
carrying the condition on that page gets a strategic-merge patch deleting it by
its merge key, a few at a time, before the next page is read. A node that
vanished meanwhile is not an error. Then every DeviceTaintRule carrying the
release's labels (``--release``) is deleted, unless ``--device-taints=false``:
another release's rules are never touched.

Deadlines: each request has ``--cleanup-request-timeout`` (10 s) and the whole
run ``--cleanup-timeout`` (the chart's ``controller.cleanupTimeoutSeconds``).
A request that fails in a way worth trying again (no answer, a timeout, 429,
5xx) is retried with capwatch's backoff, the server's Retry-After a floor, for
as long as the whole run's deadline allows; a page of the node list is retried
from its own continue token, and the list starts over if the token expired
(410). What is left at the end, refused for good (403, say) or out of time, is
named in the log, one object per line, and the exit code is 1.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TextIO, TypeVar

from capwatch.controller.conditions import CONDITION_TYPE
from capwatch.controller.errors import ApiError, NotFound
from capwatch.controller.kube import NODES, TAINT_RULES, KubeApi, api_client
from capwatch.controller.settings import CleanupLimits, ControllerSettings
from capwatch.controller.taints import TaintPolicy
from capwatch.kit.backoff import Backoff
from capwatch.kit.clock import Clock, SystemClock
from capwatch.kit.errors import CapwatchError, ConfigError

log = logging.getLogger(__name__)

CONCURRENCY = 16
BACKOFF = Backoff(initial_s=0.5, max_s=10.0)
GONE = 410  # a list's continue token expired: the list starts over

_T = TypeVar("_T")


class CleanupApi(Protocol):
    """What the cleanup asks of the API server (:class:`capwatch.controller.kube.KubeApi`)."""

    async def list_page(
        self, path: str, *, label_selector: str, token: str, deadline_s: float
    ) -> tuple[list[dict[str, Any]], str]: ...

    async def remove_condition(self, node: str, *, deadline_s: float) -> None: ...

    async def delete_taint_rule(self, name: str, *, deadline_s: float) -> None: ...


class OutOfTime(CapwatchError):
    """The run's deadline passed before the call succeeded."""


def _retryable(exc: ApiError) -> bool:
    return exc.status is None or exc.status == 429 or exc.status >= 500


def _carries(node: dict[str, Any]) -> bool:
    """Whether the Node has the condition, whatever is in it (even what capwatch would not
    read: it is removed all the same)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(isinstance(c, dict) and c.get("type") == CONDITION_TYPE for c in conditions)


def _name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


class _Run:
    """One cleanup: its deadline, its retries, and what it could not do."""

    def __init__(
        self, api: CleanupApi, limits: CleanupLimits, *, clock: Clock, rng: random.Random
    ) -> None:
        self._api = api
        self._limits = limits
        self._clock = clock
        self._rng = rng
        self._deadline = clock.monotonic() + limits.overall_s
        self.left: list[str] = []  # "KIND NAME: why", for each object not cleaned

    async def call(self, what: str, attempt_call: Callable[[float], Awaitable[_T]]) -> _T:
        """``attempt_call(timeout_s)`` until it succeeds, fails for good (raised), or the
        run's deadline passes (:class:`OutOfTime`, from the last failure)."""
        failures = 0
        while True:
            left = self._deadline - self._clock.monotonic()
            if left <= 0:
                raise OutOfTime(f"out of time before {what} was tried")
            try:
                return await attempt_call(min(self._limits.request_s, left))
            except ApiError as exc:
                if not _retryable(exc):
                    raise
                wait = BACKOFF.delay(failures, self._rng, floor_s=exc.retry_after)
                failures += 1
                if self._clock.monotonic() + wait >= self._deadline:
                    raise OutOfTime(f"{exc} (out of time after {failures} tries)") from exc
                log.info("retrying in %.2fs: %s", wait, exc)
                await asyncio.sleep(wait)

    async def each(
        self, kind: str, names: list[str], act: Callable[[str, float], Awaitable[None]]
    ) -> int:
        """``act(name, timeout_s)`` for every name, a few at a time; the count done."""
        gate = asyncio.Semaphore(CONCURRENCY)
        done = 0
        left: dict[str, str] = {}

        async def one(name: str) -> None:
            nonlocal done
            async with gate:
                try:
                    await self.call(f"{kind} {name}", lambda s: act(name, s))
                except NotFound:
                    pass  # gone meanwhile: nothing left of it to clean
                except (ApiError, OutOfTime) as exc:
                    left[name] = f"{kind} {name}: {exc}"
                    return
                done += 1

        await asyncio.gather(*(one(name) for name in names))
        self.left += [left[name] for name in names if name in left]  # in listing order
        return done

    async def pages(
        self, path: str, selector: str, kind: str
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """Each page of the list endpoint ``path`` in turn, each retried on its own; the
        list starts over if its continue token expired. Raises ApiError or OutOfTime."""
        token, number = "", 0
        while True:
            number += 1
            try:
                items, following = await self.call(
                    f"listing {kind}s (page {number})",
                    lambda s, token=token: self._api.list_page(  # type: ignore[misc]
                        path, label_selector=selector, token=token, deadline_s=s
                    ),
                )
            except ApiError as exc:
                if exc.status != GONE or not token:
                    raise
                log.info("the %s list's continue token expired: listing again", kind)
                token, number = "", 0
                continue
            yield items
            if not following:
                return
            token = following


async def remove_conditions(run: _Run, api: CleanupApi, *, out: TextIO) -> None:
    """Remove the condition from every Node that carries it, page by page."""
    seen: set[str] = set()  # a list started over must not count its nodes twice
    removed = 0
    try:
        async for page in run.pages(NODES, "", "node"):
            seen.update(_name(n) for n in page)
            carriers = [_name(n) for n in page if _carries(n) and _name(n)]
            removed += await run.each(
                "node",
                carriers,
                lambda name, s: api.remove_condition(name, deadline_s=s),
            )
    except (ApiError, OutOfTime) as exc:
        run.left.append(f"nodes after the first {len(seen)} listed: cannot list them: {exc}")
    print(f"removed {CONDITION_TYPE} from {removed} of {len(seen)} nodes", file=out)


async def remove_taint_rules(
    run: _Run, api: CleanupApi, policy: TaintPolicy, *, out: TextIO
) -> None:
    """Delete the release's DeviceTaintRules."""
    names: list[str] = []
    try:
        async for page in run.pages(TAINT_RULES, policy.selector(), "DeviceTaintRule"):
            names += [_name(r) for r in page if _name(r)]
    except NotFound:
        pass  # no resource.k8s.io/v1 here: there can be none
    except (ApiError, OutOfTime) as exc:
        run.left.append(f"DeviceTaintRules: cannot list them: {exc}")
        return
    removed = await run.each(
        "DeviceTaintRule", names, lambda name, s: api.delete_taint_rule(name, deadline_s=s)
    )
    print(f"removed {removed} of {len(names)} DeviceTaintRules", file=out)


async def clean(
    api: CleanupApi,
    *,
    limits: CleanupLimits,
    taints: TaintPolicy | None,
    out: TextIO,
    clock: Clock | None = None,
    rng: random.Random | None = None,
) -> int:
    """Both passes under one deadline; the exit code (0, or 1 if anything was left)."""
    run = _Run(api, limits, clock=clock or SystemClock(), rng=rng or random.Random())
    await remove_conditions(run, api, out=out)
    if taints is not None:
        await remove_taint_rules(run, api, taints, out=out)
    if run.left:
        print(f"capwatch controller cleanup: {len(run.left)} left:", file=out)
        for line in run.left:
            print(f"  {line}", file=out)
    return 1 if run.left else 0


async def run_cleanup(settings: ControllerSettings, *, out: TextIO) -> int:
    """``capwatch controller cleanup`` with the controller's own API settings."""
    if settings.dry_run:
        raise ConfigError("--dry-run", "cleanup writes to the API server; it has no dry run")
    client = api_client(
        None if settings.kubeconfig is None else str(settings.kubeconfig),
        identity=settings.identity,
    )
    api = KubeApi(
        client,
        namespace=settings.namespace or "default",
        identity=settings.identity,
        release=settings.release,
    )
    try:
        return await clean(
            api,
            limits=settings.cleanup,
            taints=settings.taints if settings.taints.enabled else None,
            out=out,
        )
    finally:
        api.close()
