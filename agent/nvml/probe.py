"""``capwatch probe``: what this node's GPUs answer to every read the agent makes.

It opens the real NVML backend (nothing is written), reads each GPU's UUID,
power constraints and processes, and the per-cycle telemetry the health model
judges, then listens for XID and double-bit ECC events for a while. Each read
is reported as its value, ``not available`` (the device does not support it)
or ``failed``, so an operator can see at once what a GPU model and driver
offer before relying on device health, and a machine with a real GPU can be
checked in one command (``--json`` for a file to keep). The CLI imports this
module only for ``probe``, so nothing else loads NVML through it.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, TextIO

from capwatch.agent.gpus import GpuBackend, GpuError
from capwatch.agent.health.telemetry import DeviceEvent, Readings
from capwatch.agent.nvml.backend import NvmlBackend
from capwatch.kit.errors import ConfigError
from capwatch.kit.flags import Option, add_options, boolean, read_options

MAX_EVENTS_FOR_S = 3600.0
DRAIN_EVERY_S = 0.25


def _seconds(flag: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(flag, f"not a number: {text!r}") from None
    if not 0 <= value <= MAX_EVENTS_FOR_S:  # NaN fails this too
        raise ConfigError(flag, f"must be between 0 and {MAX_EVENTS_FOR_S:g} seconds, got {text!r}")
    return value


OPTIONS = (
    Option(
        flag="--events-for",
        env="CAPWATCH_PROBE_EVENTS_FOR",
        default="5",
        convert=_seconds,
        help="seconds to listen for XID and double-bit ECC events after the reads (0: none)",
    ),
    Option(
        flag="--json",
        env="CAPWATCH_PROBE_JSON",
        default="false",
        convert=boolean,
        help="print one JSON document instead of text",
        switch=True,
    ),
)


@dataclass(frozen=True, kw_only=True)
class ProbeSettings:
    events_for_s: float
    json: bool


def add_probe_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser, OPTIONS)


def probe_settings(namespace: argparse.Namespace, environ: Mapping[str, str]) -> ProbeSettings:
    values = read_options(namespace, environ, OPTIONS)
    return ProbeSettings(events_for_s=values["events_for"], json=values["json"])


def probe(
    backend: GpuBackend,
    *,
    events_for_s: float,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Every GPU's answers, then the events that arrived within ``events_for_s``."""
    gpus: list[dict[str, Any]] = []
    try:
        count = backend.device_count()
    except GpuError as exc:
        return {"device_count": f"failed: {exc.error_class.value}", "gpus": [], "events": []}
    for index in range(count):
        gpus.append(_gpu(backend, index))
    events: dict[tuple[object, ...], DeviceEvent] = {}
    _merge(events, backend.drain_events())
    deadline = monotonic() + events_for_s
    while monotonic() < deadline:
        sleep(min(DRAIN_EVERY_S, max(0.0, deadline - monotonic())))
        _merge(events, backend.drain_events())
    return {
        "device_count": count,
        "gpus": gpus,
        "events_for_s": events_for_s,
        "events": [asdict(e) | {"kind": e.kind.value} for e in events.values()],
    }


def _merge(into: dict[tuple[object, ...], DeviceEvent], drained: Iterable[DeviceEvent]) -> None:
    """One entry per GPU, kind and code across drains, as one drain aggregates them."""
    for event in drained:
        key = (event.kind, event.index, event.uuid, event.code)
        old = into.get(key)
        into[key] = (
            event
            if old is None
            else replace(old, count=old.count + event.count, last_wall=event.last_wall)
        )


def _gpu(backend: GpuBackend, index: int) -> dict[str, Any]:
    def answer(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except GpuError as exc:
            return f"failed: {exc.error_class.value}"

    constraints = answer(lambda: backend.constraints(index))
    return {
        "index": index,
        "uuid": answer(lambda: backend.uuid(index)),
        "constraints_milliwatts": asdict(constraints)
        if not isinstance(constraints, str)
        else constraints,
        "processes": answer(lambda: len(backend.processes(index))),
        "readings": _readings(backend.readings(index)),
    }


def _readings(readings: Readings) -> dict[str, Any]:
    failed = set(readings.failed_reads)
    fields = {
        "power_draw_milliwatts": ("power_draw", readings.power_draw_milliwatts),
        "enforced_limit_milliwatts": ("enforced_limit", readings.enforced_limit_milliwatts),
        "throttle_reasons": (
            "throttle_reasons",
            None
            if readings.throttle_reasons is None
            else [r.value for r in readings.throttle_reasons],
        ),
        "ecc_uncorrected_volatile": ("ecc", readings.ecc_uncorrected_volatile),
        "row_remap_pending": ("row_remap", readings.row_remap_pending),
        "row_remap_failure": ("row_remap", readings.row_remap_failure),
    }
    if readings.row_remap_pending is None:  # older parts answer this instead of row remapping
        fields["retired_pages_pending"] = ("retired_pages", readings.retired_pages_pending)
    out: dict[str, Any] = {}
    for name, (read, value) in fields.items():
        if value is not None:
            out[name] = value
        else:
            out[name] = "failed" if read in failed else "not available"
    out["lost"] = readings.lost
    return out


def render(result: Mapping[str, Any], out: TextIO, *, as_json: bool) -> None:
    if as_json:
        json.dump(result, out, indent=2, sort_keys=True)
        out.write("\n")
        return
    out.write(f"GPUs: {result['device_count']}\n")
    for gpu in result["gpus"]:
        out.write(f"GPU {gpu['index']}  {gpu['uuid']}\n")
        out.write(f"  power limits: {_constraints(gpu['constraints_milliwatts'])}\n")
        out.write(f"  compute processes: {gpu['processes']}\n")
        for name, value in gpu["readings"].items():
            out.write(f"  {name}: {_plain(value)}\n")
    waited = result.get("events_for_s", 0)
    events = result["events"]
    out.write(f"events in {waited:g} s: {len(events) or 'none'}\n")
    for event in events:
        out.write(
            f"  {event['kind']} code={event['code']} gpu={event['index']} "
            f"uuid={event['uuid']} count={event['count']}\n"
        )


def _constraints(constraints: Mapping[str, int] | str) -> str:
    """``min 100000 mW, max 400000 mW, default 300000 mW``, or the failure as read."""
    if isinstance(constraints, str):
        return constraints
    return ", ".join(
        f"{bound} {constraints[f'{bound}_milliwatts']} mW" for bound in ("min", "max", "default")
    )


def _plain(value: object) -> str:
    """A reading as a person reads it: no Python list or boolean spelling."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ", ".join(str(item) for item in value) or "none"
    return str(value)


def run_probe(settings: ProbeSettings, out: TextIO) -> int:
    """Open NVML, probe, print, close. Raises BackendUnavailable (exit 1 in the CLI)."""
    with NvmlBackend.open() as backend:
        result = probe(backend, events_for_s=settings.events_for_s)
    render(result, out, as_json=settings.json)
    return 0
