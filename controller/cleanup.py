"""``capwatch controller cleanup``: remove ``GPUPowerCapEnforced`` from every Node, and the
release's DeviceTaintRules.

Run by the chart's post-delete hook (``controller.cleanupOnDelete``), so that
uninstalling capwatch does not leave every node carrying a condition nobody
updates any more (it would read as the last thing the controller said, for
ever); post-delete, since a running leader would write a removed condition
back. Every node is listed (not only the GPU nodes: the selector may have
changed since the condition was written) and each one carrying the condition
gets a strategic-merge patch deleting it by its merge key, a few at a time.
A node that vanished meanwhile is not an error; any other failure is, after
every node was tried. Then every DeviceTaintRule carrying the release's labels
(``--release``) is deleted, unless ``--device-taints=false``: another release's
rules are never touched.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TextIO

from controller.conditions import CONDITION_TYPE
from controller.errors import ApiError, NotFound
from controller.kube import KubeApi, api_client
from controller.objects import node_condition
from controller.settings import ControllerSettings
from controller.taints import TaintPolicy
from kit.errors import ConfigError

log = logging.getLogger(__name__)

CONCURRENCY = 16
REQUEST_TIMEOUT_S = 10.0


async def remove_conditions(api: KubeApi, *, out: TextIO) -> int:
    """Remove the condition everywhere; the exit code (0, or 1 if any node failed)."""
    try:
        nodes = await api.list_nodes(label_selector="", deadline_s=REQUEST_TIMEOUT_S)
    except ApiError as exc:
        print(f"capwatch controller cleanup: cannot list nodes: {exc}", file=out)
        return 1
    names = [
        str((n.get("metadata") or {}).get("name") or "")
        for n in nodes
        if node_condition(n) is not None
    ]
    gate = asyncio.Semaphore(CONCURRENCY)
    failures: list[str] = []

    async def remove(name: str) -> None:
        async with gate:
            try:
                await api.remove_condition(name, deadline_s=REQUEST_TIMEOUT_S)
            except NotFound:
                return
            except ApiError as exc:
                failures.append(f"{name}: {exc}")

    await asyncio.gather(*(remove(name) for name in names if name))
    removed = len(names) - len(failures)
    print(f"removed {CONDITION_TYPE} from {removed} of {len(nodes)} nodes", file=out)
    for failure in failures[:10]:
        print(f"capwatch controller cleanup: {failure}", file=out)
    return 1 if failures else 0


async def remove_taint_rules(api: KubeApi, policy: TaintPolicy, *, out: TextIO) -> int:
    """Delete the release's DeviceTaintRules; the exit code (0, or 1 if any failed)."""
    try:
        rules = await api.list_taint_rules(
            label_selector=policy.selector(), deadline_s=REQUEST_TIMEOUT_S
        )
    except NotFound:
        rules = []  # no resource.k8s.io/v1 here: there can be none
    except ApiError as exc:
        print(f"capwatch controller cleanup: cannot list DeviceTaintRules: {exc}", file=out)
        return 1
    names = [str((r.get("metadata") or {}).get("name") or "") for r in rules]
    gate = asyncio.Semaphore(CONCURRENCY)
    failures: list[str] = []

    async def remove(name: str) -> None:
        async with gate:
            try:
                await api.delete_taint_rule(name, deadline_s=REQUEST_TIMEOUT_S)
            except NotFound:
                return
            except ApiError as exc:
                failures.append(f"{name}: {exc}")

    await asyncio.gather(*(remove(name) for name in names if name))
    print(f"removed {len(names) - len(failures)} of {len(names)} DeviceTaintRules", file=out)
    for failure in failures[:10]:
        print(f"capwatch controller cleanup: {failure}", file=out)
    return 1 if failures else 0


async def run_cleanup(settings: ControllerSettings, *, out: TextIO) -> int:
    """``capwatch controller cleanup`` with the controller's own API settings."""
    if settings.dry_run:
        raise ConfigError("--dry-run", "cleanup writes to the API server; it has no dry run")
    client = api_client(
        None if settings.kubeconfig is None else str(settings.kubeconfig),
        identity=settings.identity,
    )
    api = KubeApi(client, namespace=settings.namespace or "default", identity=settings.identity)
    try:
        code = await remove_conditions(api, out=out)
        if settings.taints.enabled:
            code = max(code, await remove_taint_rules(api, settings.taints, out=out))
        return code
    finally:
        api.close()
