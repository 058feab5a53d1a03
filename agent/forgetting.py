"""An operator's request to forget a GPU the agent capped that is gone for good.

A GPU this agent capped that stops being visible (it fell off the bus, or
was removed) cannot be released, so every cycle reports its release as
deferred and fails: the agent stays NotReady, as the readiness rule says it
must while a cap it set may still be in force. Only an operator can know the
GPU is not coming back (and that a GPU reset or a reboot has cleared its
limit anyway). ``capwatch forget UUID`` records that decision as a file under
``<state-dir>/forget/``, the agent's own durable directory, which the running
agent reads at its next cycle: it drops the GPU from its ownership record if
the GPU is still not visible, refuses if it is visible (its cap is then
released as usual), and removes the request either way.

A file, not an RPC: it works while the agent is down or its gRPC server is
unreachable, needs no new network surface, and is done with the access that
``kubectl exec`` into the agent container already implies.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TextIO

from capwatch.agent.ownership import FILE_NAME, OwnershipRecord, OwnershipStore, read_records
from capwatch.agent.settings import STATE_DIR_OPTION
from capwatch.kit.errors import CapwatchError, OwnershipError
from capwatch.kit.flags import add_options, read_options

log = logging.getLogger(__name__)

DIRECTORY = "forget"
# NVML UUIDs (GPU-..., MIG-...) and anything a backend reports: a file name,
# never a path.
_UUID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class ForgetError(CapwatchError):
    """A forget request could not be made."""


def request_forget(state_dir: Path, uuid: str, records: Mapping[str, OwnershipRecord]) -> Path:
    """Ask the agent that owns ``state_dir`` to forget ``uuid``; returns the request file.

    ``records`` is the ownership record as the agent last persisted it: a
    UUID that is not in it is refused here, where the operator sees the
    mistake, rather than discarded later in the agent's log.
    """
    _check(uuid, records)
    directory = state_dir / DIRECTORY
    try:
        directory.mkdir(exist_ok=True)
        path = directory / uuid
        # Created whole under a dot name the agent skips, then renamed.
        partial = directory / f".{uuid}.{os.getpid()}"
        partial.write_text(f"{uuid}\n")
        os.replace(partial, path)
    except OSError as exc:
        raise ForgetError(f"cannot write a request under {directory}: {exc}") from exc
    return path


def add_forget_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser, (STATE_DIR_OPTION,))
    parser.add_argument(
        "uuids",
        nargs="+",
        metavar="UUID",
        help="a GPU the agent capped that is gone, as its log or `capwatch watch` names it",
    )


def run_forget(namespace: argparse.Namespace, environ: Mapping[str, str], out: TextIO) -> int:
    """``capwatch forget``: request every UUID, or none if any is refused (exit 1)."""
    state_dir: Path = read_options(namespace, environ, (STATE_DIR_OPTION,))["state_dir"]
    uuids: list[str] = list(dict.fromkeys(namespace.uuids))
    try:
        if not (state_dir / FILE_NAME).exists():
            raise ForgetError(
                f"no ownership record in {state_dir}: no agent has capped a GPU from this "
                "state directory (is it the agent's --state-dir?); nothing to forget"
            )
        records = read_records(state_dir)
        for uuid in uuids:  # check them all before writing any
            _check(uuid, records)
        for uuid in uuids:
            request_forget(state_dir, uuid, records)
            record = records[uuid]
            print(
                f"{uuid} (index {record.index}, {record.target_milliwatts / 1000:g} W): the "
                "agent forgets it at its next cycle if it is still not visible",
                file=out,
            )
    except (ForgetError, OwnershipError) as exc:
        print(f"capwatch forget: {exc}", file=sys.stderr)
        return 1
    return 0


def _check(uuid: str, records: Mapping[str, OwnershipRecord]) -> None:
    if not _UUID.fullmatch(uuid):
        raise ForgetError(f"{uuid!r} is not a GPU UUID")
    if uuid not in records:
        known = ", ".join(sorted(records)) or "none"
        raise ForgetError(f"{uuid} is not in the ownership record (capped GPUs: {known})")


class ForgetRequests:
    """The agent's side: pending requests, applied once per cycle by the reconciler."""

    def __init__(self, state_dir: Path) -> None:
        self._directory = state_dir / DIRECTORY

    def apply(self, store: OwnershipStore, visible: Iterable[str]) -> list[OwnershipRecord]:
        """Forget each requested GPU that is owned and not in ``visible``; returns them.

        Every request is consumed: applied, refused (visible, or not owned) or
        discarded (not a UUID), with a log line saying which.
        """
        names = self._pending()
        if not names:
            return []
        seen = set(visible)
        forgotten = []
        for name in names:
            record = store.get(name) if _UUID.fullmatch(name) else None
            if record is None:
                log.warning("forget request %s: not a GPU this agent capped; discarded", name)
            elif name in seen:
                log.warning(
                    "forget request for %s refused: the GPU is visible (index %d); "
                    "its cap is released as usual once its pods are gone",
                    name,
                    record.index,
                )
            else:
                store.release(name)
                forgotten.append(record)
                log.warning(
                    "forgot GPU %s (index %d) at an operator's request; its cap of %d mW "
                    "for %s was never released",
                    name,
                    record.index,
                    record.target_milliwatts,
                    ", ".join(f"{p.namespace}/{p.name}" for p in record.owners) or "no pod",
                )
            self._consume(name)
        return forgotten

    def _pending(self) -> list[str]:
        """Request files, oldest name first; dot names are requests still being written."""
        try:
            with os.scandir(self._directory) as entries:
                names = [
                    e.name
                    for e in entries
                    if e.is_file(follow_symlinks=False) and not e.name.startswith(".")
                ]
        except FileNotFoundError:
            return []
        except OSError as exc:
            log.warning("cannot read forget requests in %s: %s", self._directory, exc)
            return []
        return sorted(names)

    def _consume(self, name: str) -> None:
        try:
            with contextlib.suppress(FileNotFoundError):
                (self._directory / name).unlink()
        except OSError as exc:
            log.warning("cannot remove forget request %s: %s", self._directory / name, exc)
